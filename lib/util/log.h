// Library logging, routed to the callback set with h2o_set_log_callback.
#pragma once

#include <string>

#include "h2o/h2o.h"

namespace h2o {

void log(h2o_log_level level, const std::string &message);

}  // namespace h2o
