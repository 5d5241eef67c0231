// JSON text as people (and web/API.md) write numbers: 33.96 and 0.001, not
// Boost.JSON's 3.396E1 and 1E-3. For the dashboard's API and WebSocket.
#pragma once

#include <boost/json/value.hpp>
#include <string>

namespace tether {

// `value` serialized like boost::json::serialize, except that a double is
// written as the shortest decimal that reads back as the same double
// (std::to_chars), and NaN or Inf, which JSON cannot hold, as null.
std::string JsonText(const boost::json::value& value);

}  // namespace tether
