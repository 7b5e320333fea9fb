// Library logging, routed to the callback set with h2o_set_log_callback.
#pragma once

#include <string>

#include "h2o/h2o.h"

namespace h2o {

void log(h2o_log_level level, const std::string &message);
// Where log() sends messages (h2o_set_log_callback checks the level and calls this): a null
// callback drops them.
void set_log_sink(h2o_log_callback callback, void *user_data, h2o_log_level min_level);

}  // namespace h2o
