// Test support: a checker for the Prometheus text exposition format
// (version 0.0.4), as /metrics serves it, and a reader for one sample.
//
// CheckExposition is strict where the format leaves room, so that what it
// accepts every Prometheus version scrapes: each sample's family needs a
// TYPE line before it, a family's lines are contiguous, and histograms are
// checked for consistency (cumulative buckets, an le="+Inf" bucket equal to
// _count).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace tether {

struct ExpositionSample {
  std::string name;
  std::map<std::string, std::string> labels;  // values unescaped
  double value = 0;
};

namespace prometheus_internal {

inline bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
inline bool IsNameChar(char c) {
  return IsNameStart(c) || (c >= '0' && c <= '9');
}

// A sample value as the format writes it: a Go float, NaN, +Inf or -Inf.
inline std::optional<double> ParseValue(const std::string& text) {
  static const std::regex kNumber(
      R"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)");
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (text == "+Inf") return std::numeric_limits<double>::infinity();
  if (text == "-Inf") return -std::numeric_limits<double>::infinity();
  if (!std::regex_match(text, kNumber)) return std::nullopt;
  return std::strtod(text.c_str(), nullptr);
}

// One sample line (`name{k="v",...} value [timestamp]`); "" when it parses.
inline std::string ParseSample(const std::string& line, ExpositionSample* out) {
  size_t i = 0;
  const size_t n = line.size();
  if (i == n || !(IsNameStart(line[i]) || line[i] == ':')) {
    return "bad metric name";
  }
  while (i < n && (IsNameChar(line[i]) || line[i] == ':')) ++i;
  out->name = line.substr(0, i);
  out->labels.clear();
  if (i < n && line[i] == '{') {
    ++i;
    while (true) {
      if (i < n && line[i] == '}') {
        ++i;
        break;
      }
      const size_t start = i;
      if (i == n || !IsNameStart(line[i])) return "bad label name";
      while (i < n && IsNameChar(line[i])) ++i;
      const std::string key = line.substr(start, i - start);
      if (i == n || line[i] != '=') return "expected '=' after label " + key;
      ++i;
      if (i == n || line[i] != '"') return "expected '\"' for label " + key;
      ++i;
      std::string value;
      while (true) {
        if (i == n) return "unterminated value of label " + key;
        const char c = line[i++];
        if (c == '"') break;
        if (c == '\\') {
          if (i == n) return "unterminated escape in label " + key;
          const char e = line[i++];
          if (e == '\\' || e == '"') {
            value += e;
          } else if (e == 'n') {
            value += '\n';
          } else {
            return std::string("bad escape \\") + e + " in label " + key;
          }
        } else {
          value += c;
        }
      }
      if (!out->labels.emplace(key, value).second) {
        return "label " + key + " repeated";
      }
      if (i < n && line[i] == ',') {
        ++i;
      } else if (i == n || line[i] != '}') {
        return "expected ',' or '}' after label " + key;
      }
    }
  }
  if (i == n || (line[i] != ' ' && line[i] != '\t')) {
    return "expected a space before the value";
  }
  while (i < n && (line[i] == ' ' || line[i] == '\t')) ++i;
  std::istringstream rest(line.substr(i));
  std::string value_text, timestamp, extra;
  rest >> value_text >> timestamp >> extra;
  if (!extra.empty()) return "trailing text '" + extra + "'";
  std::optional<double> value = ParseValue(value_text);
  if (!value) return "bad value '" + value_text + "'";
  static const std::regex kTimestamp(R"(-?[0-9]+)");
  if (!timestamp.empty() && !std::regex_match(timestamp, kTimestamp)) {
    return "bad timestamp '" + timestamp + "'";
  }
  out->value = *value;
  return "";
}

inline std::string Problem(int line_number, const std::string& what,
                           const std::string& line) {
  return "line " + std::to_string(line_number) + ": " + what + ": " + line;
}

inline std::string Strip(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
                 s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0
             ? s.substr(0, s.size() - suffix.size())
             : "";
}

}  // namespace prometheus_internal

// Every sample line of `text`, in order; lines that are not samples
// (comments, blanks, malformed lines) are skipped.
inline std::vector<ExpositionSample> ExpositionSamples(
    const std::string& text) {
  std::vector<ExpositionSample> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    ExpositionSample sample;
    if (prometheus_internal::ParseSample(line, &sample).empty()) {
      out.push_back(std::move(sample));
    }
  }
  return out;
}

// The value of the sample named `name` with exactly the labels `labels`;
// nullopt when there is none.
inline std::optional<double> SampleValue(
    const std::string& text, const std::string& name,
    const std::map<std::string, std::string>& labels = {}) {
  for (const ExpositionSample& s : ExpositionSamples(text)) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

// "" when `text` is a valid exposition, else the first problem found:
// "line N: what: the line".
inline std::string CheckExposition(const std::string& text) {
  namespace pi = prometheus_internal;
  static const std::regex kHelp(
      R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*)(?: (.*))?)");
  static const std::regex kType(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
  if (text.empty()) return "";
  if (text.back() != '\n') return "the last line does not end with a newline";

  std::map<std::string, std::string> types;  // family -> type
  std::set<std::string> helps;
  std::set<std::string> sampled;  // families with a sample seen
  std::set<std::string> closed;   // families whose lines ended
  std::string current;            // the family of the latest line
  std::set<std::pair<std::string, std::map<std::string, std::string>>> series;
  struct Bucket {
    double le;
    double value;
    int line;
    std::string text;
  };
  // histogram family -> labels without le -> its buckets
  std::map<std::string,
           std::map<std::map<std::string, std::string>, std::vector<Bucket>>>
      buckets;
  std::map<std::string, std::map<std::map<std::string, std::string>, double>>
      counts;

  auto enter = [&](const std::string& family) -> std::string {
    if (family == current) return "";
    if (closed.count(family)) return "family " + family + " is split";
    if (!current.empty()) closed.insert(current);
    current = family;
    return "";
  };

  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::smatch m;
      if (line.rfind("# HELP", 0) == 0 && line.size() > 6 &&
          (line[6] == ' ' || line[6] == '\t')) {
        if (!std::regex_match(line, m, kHelp)) {
          return pi::Problem(number, "malformed HELP", line);
        }
        const std::string name = m[1];
        const std::string help = m[2];
        for (size_t i = 0; i < help.size(); ++i) {
          if (help[i] != '\\') continue;
          if (i + 1 == help.size() ||
              (help[i + 1] != '\\' && help[i + 1] != 'n')) {
            return pi::Problem(number, "bad escape in HELP", line);
          }
          ++i;
        }
        if (!helps.insert(name).second) {
          return pi::Problem(number, "second HELP for " + name, line);
        }
        if (std::string e = enter(name); !e.empty()) {
          return pi::Problem(number, e, line);
        }
      } else if (line.rfind("# TYPE", 0) == 0 && line.size() > 6 &&
                 (line[6] == ' ' || line[6] == '\t')) {
        if (!std::regex_match(line, m, kType)) {
          return pi::Problem(number, "malformed TYPE", line);
        }
        const std::string name = m[1];
        if (types.count(name)) {
          return pi::Problem(number, "second TYPE for " + name, line);
        }
        if (sampled.count(name)) {
          return pi::Problem(number, "TYPE after samples of " + name, line);
        }
        types[name] = m[2];
        if (std::string e = enter(name); !e.empty()) {
          return pi::Problem(number, e, line);
        }
      }
      continue;  // any other comment
    }

    ExpositionSample s;
    if (std::string e = pi::ParseSample(line, &s); !e.empty()) {
      return pi::Problem(number, e, line);
    }
    // The family: for histograms and summaries the name less its suffix.
    std::string family = s.name;
    std::string suffix;
    for (const char* sfx : {"_bucket", "_sum", "_count"}) {
      const std::string base = pi::Strip(s.name, sfx);
      if (base.empty()) continue;
      auto it = types.find(base);
      if (it == types.end()) continue;
      if (it->second == "histogram" ||
          (it->second == "summary" && std::string(sfx) != "_bucket")) {
        family = base;
        suffix = sfx;
        break;
      }
    }
    auto type = types.find(family);
    if (type == types.end()) {
      return pi::Problem(number, "sample of " + family + " before its TYPE",
                         line);
    }
    if (std::string e = enter(family); !e.empty()) {
      return pi::Problem(number, e, line);
    }
    sampled.insert(family);
    if (!series.emplace(s.name, s.labels).second) {
      return pi::Problem(number, "duplicate series", line);
    }
    const std::string& kind = type->second;
    if (kind == "counter" && s.value < 0) {
      return pi::Problem(number, "negative counter", line);
    }
    if (kind == "histogram") {
      if (suffix.empty()) {
        return pi::Problem(number, "histogram sample without a suffix", line);
      }
      if (s.labels.count("le") && suffix != "_bucket") {
        return pi::Problem(number, "le label outside a bucket", line);
      }
      if (suffix == "_bucket") {
        auto le = s.labels.find("le");
        if (le == s.labels.end()) {
          return pi::Problem(number, "bucket without le", line);
        }
        std::optional<double> bound = pi::ParseValue(le->second);
        if (!bound || std::isnan(*bound)) {
          return pi::Problem(number, "bad le '" + le->second + "'", line);
        }
        auto rest = s.labels;
        rest.erase("le");
        buckets[family][rest].push_back({*bound, s.value, number, line});
      } else if (suffix == "_count") {
        counts[family][s.labels] = s.value;
      }
    }
    if (kind == "summary" && suffix.empty() && !s.labels.count("quantile")) {
      return pi::Problem(number, "summary sample without quantile", line);
    }
  }

  for (auto& [family, by_labels] : buckets) {
    for (auto& [labels, list] : by_labels) {
      std::sort(list.begin(), list.end(),
                [](const Bucket& a, const Bucket& b) { return a.le < b.le; });
      for (size_t i = 1; i < list.size(); ++i) {
        if (list[i].le == list[i - 1].le) {
          return pi::Problem(list[i].line, "repeated le", list[i].text);
        }
        if (list[i].value < list[i - 1].value) {
          return pi::Problem(list[i].line, "bucket below the one before",
                             list[i].text);
        }
      }
      const Bucket& last = list.back();
      if (!std::isinf(last.le)) {
        return pi::Problem(last.line, "no le=\"+Inf\" bucket for " + family,
                           last.text);
      }
      auto count = counts[family].find(labels);
      if (count == counts[family].end()) {
        return pi::Problem(last.line, "no " + family + "_count", last.text);
      }
      if (count->second != last.value) {
        return pi::Problem(last.line,
                           "le=\"+Inf\" differs from " + family + "_count",
                           last.text);
      }
    }
  }
  return "";
}

}  // namespace tether
