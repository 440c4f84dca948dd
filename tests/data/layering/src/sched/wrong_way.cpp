// Fixture for the layering check: the scheduler must not see the model.
#include "kv/kv_cache_manager.h"
#include "model/deepseek_v3.h"
