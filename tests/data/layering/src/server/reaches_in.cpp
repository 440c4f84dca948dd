// Fixture for the layering check: the server sees the engine only through engine_client.h.
#include "engine/engine_client.h"
#include "engine/engine_core.h"
