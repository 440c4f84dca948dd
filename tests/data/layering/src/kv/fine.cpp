// Fixture for the layering check: an allowed include.
#include "common/status.h"
