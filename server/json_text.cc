#include "server/json_text.h"

#include <boost/json/serialize.hpp>
#include <charconv>
#include <cmath>

namespace tether {
namespace {

namespace json = boost::json;

void Write(const json::value& v, std::string& out) {
  switch (v.kind()) {
    case json::kind::double_: {
      const double d = v.get_double();
      if (!std::isfinite(d)) {
        out += "null";
        return;
      }
      char text[64];
      auto [end, ec] = std::to_chars(text, text + sizeof text, d);
      out.append(text, ec == std::errc() ? end : text);
      return;
    }
    case json::kind::object: {
      out += '{';
      bool first = true;
      for (const json::key_value_pair& kv : v.get_object()) {
        if (!first) out += ',';
        first = false;
        out += json::serialize(json::string_view(kv.key()));
        out += ':';
        Write(kv.value(), out);
      }
      out += '}';
      return;
    }
    case json::kind::array: {
      out += '[';
      bool first = true;
      for (const json::value& e : v.get_array()) {
        if (!first) out += ',';
        first = false;
        Write(e, out);
      }
      out += ']';
      return;
    }
    default:  // strings, integers, booleans, null: as Boost writes them
      out += json::serialize(v);
  }
}

}  // namespace

std::string JsonText(const json::value& value) {
  std::string out;
  Write(value, out);
  return out;
}

}  // namespace tether
