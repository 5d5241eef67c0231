#include "schema/flags.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace tether {
namespace {

template <typename T>
Status ParseInteger(const std::string& name, const std::string& text, T* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  if (ec != std::errc() || ptr != end || text.empty()) {
    return InvalidArgument("--" + name + ": expected an integer, got '" + text +
                           "'");
  }
  return Status::Ok();
}

Status ParseReal(const std::string& name, const std::string& text,
                 double* out) {
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  // Underflow to a denormal is fine; overflow, inf and nan are not.
  if (text.empty() || end != text.c_str() + text.size() ||
      !std::isfinite(*out)) {
    return InvalidArgument("--" + name + ": expected a number, got '" + text +
                           "'");
  }
  return Status::Ok();
}

template <typename T>
std::string ToText(const T& v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The shortest text that reads back as `value`: plain notation from 1e-4
// up to 1e16 ("0.0005", not to_chars' equally short "5e-04"), scientific
// beyond ("1e-07").
template <typename T>
std::string ShortestText(T value) {
  char text[64];
  const T magnitude = std::abs(value);
  const bool plain =
      magnitude == 0 || (magnitude >= T(1e-4) && magnitude < T(1e16));
  auto [end, ec] = plain ? std::to_chars(text, text + sizeof text, value,
                                         std::chars_format::fixed)
                         : std::to_chars(text, text + sizeof text, value);
  if (ec != std::errc()) return ToText(value);
  return std::string(text, end);
}

}  // namespace

std::string NumberText(double value) { return ShortestText(value); }

std::string NumberText(float value) { return ShortestText(value); }

std::string ShellQuote(std::string_view word) {
  auto plain = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("@%+=:,./_-").find(c) != std::string_view::npos;
  };
  if (!word.empty() && std::all_of(word.begin(), word.end(), plain)) {
    return std::string(word);
  }
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string ShellCommand(int argc, const char* const* argv) {
  return ShellCommand(std::vector<std::string>(argv, argv + argc));
}

std::string ShellCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& word : argv) {
    if (!out.empty()) out += ' ';
    out += ShellQuote(word);
  }
  return out;
}

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) {
    return "[" + host + "]:" + std::to_string(port);
  }
  return host + ":" + std::to_string(port);
}

Result<std::vector<int>> ParseWidths(const std::string& text,
                                     const std::string& flag) {
  std::vector<int> widths;
  if (text.empty()) return widths;
  for (size_t begin = 0;;) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    int w = 0;
    if (!ParseInteger(flag, text.substr(begin, comma - begin), &w).ok() ||
        w < 1 || w > 1 << 20) {
      std::string message = flag;
      message += ": expected widths like 256,128, got '";
      message += text;
      message += "'";
      return InvalidArgument(message);
    }
    widths.push_back(w);
    if (comma == text.size()) return widths;
    begin = comma + 1;
  }
}

Result<HostPort> ParseHostPort(const std::string& text, const std::string& what,
                               bool allow_zero_port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument(what + ": expected HOST:PORT, got '" + text + "'");
  }
  HostPort hp;
  hp.host = text.substr(0, colon);
  if (hp.host.front() == '[') {
    if (hp.host.size() < 3 || hp.host.back() != ']') {
      return InvalidArgument(what + ": bad host in '" + text + "'");
    }
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  } else if (hp.host.find_first_of(":[]") != std::string::npos) {
    return InvalidArgument(what + ": bad host in '" + text +
                           "' (write IPv6 addresses as [ADDR]:PORT)");
  }
  std::string port_text = text.substr(colon + 1);
  int port = -1;
  const char* end = port_text.data() + port_text.size();
  auto [ptr, ec] = std::from_chars(port_text.data(), end, port);
  if (ec != std::errc() || ptr != end || port < 0 || port > 65535 ||
      (port == 0 && !allow_zero_port)) {
    return InvalidArgument(what + ": bad port '" + port_text + "' in '" + text +
                           "'");
  }
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

FlagParser::FlagParser(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void FlagParser::Add(Flag flag) { flags_.push_back(std::move(flag)); }

void FlagParser::AddString(const std::string& name, std::string* target,
                           const std::string& help) {
  Add({name, help, *target, false, [target](const std::string& v) {
         *target = v;
         return Status::Ok();
       }});
}

void FlagParser::AddInt(const std::string& name, int* target,
                        const std::string& help) {
  Add({name, help, ToText(*target), false,
       [name, target](const std::string& v) {
         return ParseInteger(name, v, target);
       }});
}

void FlagParser::AddInt64(const std::string& name, int64_t* target,
                          const std::string& help) {
  Add({name, help, ToText(*target), false,
       [name, target](const std::string& v) {
         return ParseInteger(name, v, target);
       }});
}

void FlagParser::AddUint64(const std::string& name, uint64_t* target,
                           const std::string& help) {
  Add({name, help, ToText(*target), false,
       [name, target](const std::string& v) {
         return ParseInteger(name, v, target);
       }});
}

void FlagParser::AddUint32(const std::string& name, uint32_t* target,
                           const std::string& help) {
  Add({name, help, ToText(*target), false,
       [name, target](const std::string& v) {
         return ParseInteger(name, v, target);
       }});
}

void FlagParser::AddCustom(const std::string& name, const std::string& help,
                           const std::string& default_text,
                           std::function<Status(const std::string&)> set) {
  Add({name, help, default_text, false, std::move(set)});
}

void FlagParser::AddDouble(const std::string& name, double* target,
                           const std::string& help) {
  Add({name, help, ToText(*target), false,
       [name, target](const std::string& v) {
         return ParseReal(name, v, target);
       }});
}

void FlagParser::AddFloat(const std::string& name, float* target,
                          const std::string& help) {
  Add({name, help, ToText(*target), false,
       [name, target](const std::string& v) {
         double d = 0;
         TETHER_RETURN_IF_ERROR(ParseReal(name, v, &d));
         if (!std::isfinite(static_cast<float>(d))) {
           return InvalidArgument("--" + name + ": " + v +
                                  " is out of range for a float");
         }
         *target = static_cast<float>(d);
         return Status::Ok();
       }});
}

void FlagParser::AddBool(const std::string& name, bool* target,
                         const std::string& help) {
  Add({name, help, *target ? "true" : "false", true,
       [name, target](const std::string& v) {
         if (v == "true" || v == "1" || v.empty()) {
           *target = true;
         } else if (v == "false" || v == "0") {
           *target = false;
         } else {
           return InvalidArgument("--" + name +
                                  ": expected true or false, got '" + v + "'");
         }
         return Status::Ok();
       }});
}

Status FlagParser::Parse(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {  // everything after is positional
      for (++i; i < argc; ++i) positional_.push_back(argv[i]);
      break;
    }
    if (arg == "-h") {  // what people type first
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "help") {
      help_requested_ = true;
      continue;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      return InvalidArgument("unknown flag --" + name + " (see " + program_ +
                             " --help)");
    }
    if (!has_value && !flag->is_bool) {
      if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0) {
        return InvalidArgument("--" + name + ": missing value");
      }
      value = argv[++i];
    }
    TETHER_RETURN_IF_ERROR(flag->set(value));
    set_.insert(name);
  }
  if (env_prefix_.empty()) return Status::Ok();
  for (const Flag& f : flags_) {
    if (set_.count(f.name) > 0) continue;
    const std::string variable = EnvironmentName(f.name);
    const char* value = std::getenv(variable.c_str());
    if (value == nullptr) continue;
    // A boolean variable set but empty means true, as a bare flag does.
    std::string text = value;
    if (f.is_bool && text.empty()) text = "true";
    if (Status s = f.set(text); !s.ok()) {
      return InvalidArgument("environment variable " + variable + ": " +
                             s.message());
    }
    set_.insert(f.name);
    from_environment_.push_back(f.name);
  }
  return Status::Ok();
}

std::string FlagParser::EnvironmentName(const std::string& flag) const {
  if (env_prefix_.empty()) return "";
  std::string name = env_prefix_;
  for (char c : flag) {
    name +=
        c == '-'
            ? '_'
            : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

std::optional<int> FlagParser::ParseForMain(int argc, const char* const* argv,
                                            bool positional_allowed) {
  // The program name without any " COMMAND" suffix.
  const std::string name = program_.substr(0, program_.find(' '));
  if (Status s = Parse(argc, argv); !s.ok()) {
    std::cerr << name << ": " << s.message() << "\n";
    return 2;
  }
  if (help_requested_) {
    std::cout << Usage();
    return 0;
  }
  if (!positional_allowed && !positional_.empty()) {
    std::cerr << name << ": unexpected argument '" << positional_.front()
              << "' (flags start with --)\n";
    return 2;
  }
  return std::nullopt;
}

std::string FlagParser::Usage() const {
  std::ostringstream out;
  out << "usage: " << program_ << " [flags]\n" << summary_ << "\n\nflags:\n";
  for (const Flag& f : flags_) {
    out << "  --" << f.name << (f.is_bool ? "" : " VALUE") << "\n      "
        << f.help;
    if (!f.default_text.empty()) out << " (default: " << f.default_text << ")";
    out << "\n";
  }
  out << "  -h, --help\n      print this text\n";
  if (!env_prefix_.empty()) {
    out << "\nEvery flag may also be given as an environment variable: "
        << env_prefix_
        << "<FLAG> in upper case with '-' as '_' (--auth-key-file: "
        << EnvironmentName("auth-key-file")
        << "). A flag on the command line wins over its variable.\n";
  }
  return out.str();
}

}  // namespace tether
