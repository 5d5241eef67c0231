#include "server/checkpoint_codec.h"

#include <boost/json.hpp>
#include <type_traits>
#include <utility>

#include "server/optimizer.h"
#include "server/settings_fields.h"

namespace tether::checkpoint {
namespace {

namespace json = boost::json;

const char* InitKindName(InitSpec::Kind kind) {
  switch (kind) {
    case InitSpec::Kind::kZeros:
      return "zeros";
    case InitSpec::Kind::kUniform:
      return "uniform";
    case InitSpec::Kind::kNormal:
      return "normal";
    case InitSpec::Kind::kProvided:
      return "provided";
    case InitSpec::Kind::kConstant:
      return "constant";
  }
  return "unknown";
}

bool ParseInitKind(const std::string& name, InitSpec::Kind* kind) {
  for (InitSpec::Kind k : {InitSpec::Kind::kZeros, InitSpec::Kind::kUniform,
                           InitSpec::Kind::kNormal, InitSpec::Kind::kConstant,
                           InitSpec::Kind::kProvided}) {
    if (name == InitKindName(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

// Reads typed fields of one JSON object, keeping the first problem so that a
// decoder reads straight through and checks once at the end.
class Fields {
 public:
  Fields(const json::value& v, std::string what) : what_(std::move(what)) {
    object_ = v.if_object();
    if (object_ == nullptr) Fail("is not a JSON object");
  }

  template <typename T>
  T Number(const char* key) {
    const json::value* v = Find(key);
    if (v == nullptr) return T{};
    boost::system::error_code ec;
    // Through double for floats: every float is a double exactly.
    if constexpr (std::is_floating_point_v<T>) {
      const double d = v->to_number<double>(ec);
      if (!ec) return static_cast<T>(d);
    } else {
      const T n = v->to_number<T>(ec);
      if (!ec) return n;
    }
    Fail(std::string("field '") + key + "' is not a number in range");
    return T{};
  }

  std::string String(const char* key) {
    const json::value* v = Find(key);
    if (v == nullptr) return {};
    if (!v->is_string()) {
      Fail(std::string("field '") + key + "' is not a string");
      return {};
    }
    return std::string(v->get_string());
  }

  const json::array& Array(const char* key) {
    static const json::array kEmpty;
    const json::value* v = Find(key);
    if (v == nullptr) return kEmpty;
    if (!v->is_array()) {
      Fail(std::string("field '") + key + "' is not an array");
      return kEmpty;
    }
    return v->get_array();
  }

  bool Bool(const char* key) {
    const json::value* v = Find(key);
    if (v == nullptr) return false;
    if (!v->is_bool()) {
      Fail(std::string("field '") + key + "' is not true or false");
      return false;
    }
    return v->get_bool();
  }

  // Whether a field added after the format's first version is there.
  bool Has(const char* key) const {
    return object_ != nullptr && object_->contains(key);
  }

  // A field added after the format's first version: "" when absent.
  std::string OptionalString(const char* key) {
    if (object_ == nullptr || !object_->contains(key)) return {};
    return String(key);
  }

  const json::value& Value(const char* key) {
    static const json::value kNull;
    const json::value* v = Find(key);
    return v == nullptr ? kNull : *v;
  }

  void Fail(const std::string& problem) {
    if (error_.empty()) error_ = what_ + " " + problem;
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

 private:
  const json::value* Find(const char* key) {
    if (object_ == nullptr) return nullptr;
    const json::value* v = object_->if_contains(key);
    if (v == nullptr) Fail(std::string("has no field '") + key + "'");
    return v;
  }

  std::string what_;
  const json::object* object_ = nullptr;
  std::string error_;
};

json::value InitToJson(const InitSpec& init) {
  return json::object{{"kind", InitKindName(init.kind)},
                      {"scale", static_cast<double>(init.scale)}};
}

InitSpec InitFromJson(const json::value& v, Fields* parent) {
  Fields f(v, "init");
  InitSpec init;
  const std::string kind = f.String("kind");
  init.scale = f.Number<float>("scale");
  if (f.ok() && !ParseInitKind(kind, &init.kind)) {
    f.Fail("kind '" + kind + "' is unknown");
  }
  if (!f.ok()) parent->Fail(f.error());
  return init;
}

// Reads a setting's field `key` into *value: by its type, an optimizer by
// name, a described struct (the optimizer's settings) as an object.
template <typename T>
void ReadSetting(Fields& f, const char* key, T* value);

// Reads the described members of *out, each from the field of its name,
// but Welcome-only ones; one added since the format's first version keeps
// its default when absent.
template <typename T>
void ReadMembers(Fields& f, T* out) {
  ForEachMemberPair(*out, *out,
                    [&f](const SettingField& field, auto& value, auto&) {
                      const std::string key(field.member);
                      if (field.Has(kWelcomeOnly)) return;
                      if (!field.Has(kInFirstRounds) && !f.Has(key.c_str())) {
                        return;
                      }
                      ReadSetting(f, key.c_str(), &value);
                    });
}

template <typename T>
void ReadSetting(Fields& f, const char* key, T* value) {
  if constexpr (kIsSettingsGroup<T>) {
    Fields group(f.Value(key), key);
    ReadMembers(group, value);
    if (!group.ok()) f.Fail(group.error());
  } else if constexpr (std::is_same_v<T, bool>) {
    *value = f.Bool(key);
  } else if constexpr (std::is_same_v<T, std::string>) {
    *value = f.String(key);
  } else if constexpr (std::is_same_v<T, OptimizerKind>) {
    const std::string name = f.String(key);
    Result<OptimizerKind> kind = ParseOptimizerKind(name);
    if (kind.ok()) {
      *value = *kind;
    } else {
      f.Fail(std::string(key) + " '" + name + "' is unknown");
    }
  } else {
    static_assert(std::is_arithmetic_v<T>, "a setting of a type not read here");
    *value = f.Number<T>(key);
  }
}

// Decodes `v` into *s; the problem, naming the field, or "".
std::string DecodeSettings(const json::value& v, RunSettings* s) {
  Fields f(v, "settings");
  ReadMembers(f, s);
  if (f.ok() && (s->num_shards < 1 || s->block_size < 1)) {
    f.Fail("has num_shards or block_size below 1");
  }
  return f.ok() ? "" : f.error();
}

RunSettings ReadSettings(const json::value& v, Fields* parent) {
  RunSettings s;
  if (std::string bad = DecodeSettings(v, &s); !bad.empty()) parent->Fail(bad);
  return s;
}

}  // namespace

boost::json::value SettingsToJson(const RunSettings& s) {
  return json::value_from(s);
}

Result<RunSettings> SettingsFromJson(const boost::json::value& v) {
  RunSettings s;
  if (std::string bad = DecodeSettings(v, &s); !bad.empty()) {
    return Corruption(bad);
  }
  return s;
}

std::string HeaderToJson(const ShardSnapshot& s) {
  json::array tensors;
  for (const TensorSnapshot& t : s.tensors) {
    json::array shape;
    for (uint64_t d : t.shape) shape.push_back(d);
    tensors.push_back(json::object{{"id", t.id},
                                   {"name", t.name},
                                   {"shape", std::move(shape)},
                                   {"init", InitToJson(t.init)},
                                   {"blocks", t.blocks.size()}});
  }
  json::array tables;
  for (const TableSnapshot& t : s.tables) {
    tables.push_back(json::object{{"id", t.id},
                                  {"name", t.name},
                                  {"dim", t.dim},
                                  {"init", InitToJson(t.init)},
                                  {"rows", t.rows.size()}});
  }
  json::array clocks;
  for (int64_t c : s.worker_clocks) clocks.push_back(c);
  return json::serialize(json::object{{"format", kFormat},
                                      {"round", s.round},
                                      {"shard_id", s.shard_id},
                                      {"min_clock", s.min_clock},
                                      {"worker_clocks", std::move(clocks)},
                                      {"record_events", s.record_events},
                                      {"settings", SettingsToJson(s.settings)},
                                      {"tensors", std::move(tensors)},
                                      {"tables", std::move(tables)}});
}

Result<ShardHeader> HeaderFromJson(std::string_view text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return Corruption("header is not JSON (" + ec.message() + ")");
  Fields f(v, "header");
  if (f.ok() && f.Number<int>("format") != kFormat) {
    return Corruption("header has an unknown format");
  }
  ShardHeader header;
  ShardSnapshot* s = &header.snapshot;
  s->round = f.Number<int64_t>("round");
  s->shard_id = f.Number<int>("shard_id");
  s->min_clock = f.Number<int64_t>("min_clock");
  for (const json::value& c : f.Array("worker_clocks")) {
    boost::system::error_code cec;
    s->worker_clocks.push_back(c.to_number<int64_t>(cec));
    if (cec) f.Fail("has a worker clock that is not an integer");
  }
  // Absent in rounds written before recordings existed.
  if (v.is_object() && v.as_object().contains("record_events")) {
    s->record_events = f.Number<uint64_t>("record_events");
  }
  s->settings = ReadSettings(f.Value("settings"), &f);
  for (const json::value& tv : f.Array("tensors")) {
    Fields t(tv, "tensor");
    TensorSnapshot ts;
    ts.id = t.Number<uint32_t>("id");
    ts.name = t.String("name");
    for (const json::value& d : t.Array("shape")) {
      boost::system::error_code dec;
      ts.shape.push_back(d.to_number<uint64_t>(dec));
      if (dec) t.Fail("'" + ts.name + "' has a bad shape");
    }
    ts.init = InitFromJson(t.Value("init"), &t);
    const uint64_t blocks = t.Number<uint64_t>("blocks");
    if (!t.ok()) return Corruption(t.error());
    if (!header.blocks.emplace(ts.id, blocks).second) {
      return Corruption("header defines tensor id " + std::to_string(ts.id) +
                        " twice");
    }
    s->tensors.push_back(std::move(ts));
  }
  for (const json::value& tv : f.Array("tables")) {
    Fields t(tv, "table");
    TableSnapshot ts;
    ts.id = t.Number<uint32_t>("id");
    ts.name = t.String("name");
    ts.dim = t.Number<uint32_t>("dim");
    ts.init = InitFromJson(t.Value("init"), &t);
    const uint64_t rows = t.Number<uint64_t>("rows");
    if (!t.ok()) return Corruption(t.error());
    if (ts.dim == 0) return Corruption("table '" + ts.name + "' has dim 0");
    if (!header.rows.emplace(ts.id, rows).second) {
      return Corruption("header defines table id " + std::to_string(ts.id) +
                        " twice");
    }
    s->tables.push_back(std::move(ts));
  }
  if (!f.ok()) return Corruption(f.error());
  return header;
}

std::string RecordToJson(const RoundRecord& r) {
  json::array workers;
  for (const WorkerPosition& w : r.workers) {
    workers.push_back(json::object{{"rank", w.rank},
                                   {"clock", w.clock},
                                   {"epoch", w.epoch},
                                   {"samples", w.samples}});
  }
  json::object record{{"format", kFormat},
                      {"round", r.round},
                      {"clock", r.clock},
                      {"unix_ms", r.unix_ms},
                      {"bytes", r.bytes},
                      {"settings", SettingsToJson(r.settings)},
                      {"workers", std::move(workers)}};
  if (!r.data.empty()) record["data"] = json::parse(r.data);
  if (!r.manifest.empty()) record["manifest"] = json::parse(r.manifest);
  return json::serialize(record);
}

Result<RoundRecord> RecordFromJson(std::string_view text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return Corruption("record is not JSON (" + ec.message() + ")");
  Fields f(v, "record");
  RoundRecord record;
  RoundRecord* r = &record;
  r->round = f.Number<int64_t>("round");
  r->clock = f.Number<int64_t>("clock");
  r->unix_ms = f.Number<int64_t>("unix_ms");
  r->bytes = f.Number<uint64_t>("bytes");
  r->settings = ReadSettings(f.Value("settings"), &f);
  for (const json::value& wv : f.Array("workers")) {
    Fields w(wv, "worker");
    WorkerPosition p;
    p.rank = w.Number<int>("rank");
    p.clock = w.Number<int64_t>("clock");
    p.epoch = w.Number<int>("epoch");
    p.samples = w.Number<uint64_t>("samples");
    if (!w.ok()) f.Fail(w.error());
    r->workers.push_back(p);
  }
  if (!f.ok()) return Corruption(f.error());
  if (const json::value* data = v.as_object().if_contains("data")) {
    r->data = json::serialize(*data);
  }
  if (const json::value* manifest = v.as_object().if_contains("manifest")) {
    r->manifest = json::serialize(*manifest);
  }
  return record;
}

std::string MarkerToJson(uint64_t keys, uint64_t bytes) {
  return json::serialize(json::object{{"keys", keys}, {"bytes", bytes}});
}

Result<uint64_t> MarkerKeysFromJson(std::string_view text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) v = nullptr;  // then refused as not an object
  Fields f(v, "marker");
  const uint64_t keys = f.Number<uint64_t>("keys");
  if (!f.ok()) return Corruption(f.error());
  return keys;
}

}  // namespace tether::checkpoint

namespace tether {
namespace {

// The described members of `object` by name, but Welcome-only ones.
template <typename T>
boost::json::object MembersToJson(const T& object) {
  boost::json::object out;
  ForEachMemberPair(
      object, object,
      [&out](const SettingField& field, const auto& value, const auto&) {
        if (field.Has(kWelcomeOnly)) return;
        out[field.member] = boost::json::value_from(value);
      });
  return out;
}

}  // namespace

void tag_invoke(boost::json::value_from_tag, boost::json::value& v,
                OptimizerKind kind) {
  v = OptimizerName(kind);
}

void tag_invoke(boost::json::value_from_tag, boost::json::value& v,
                const OptimizerOptions& o) {
  v = MembersToJson(o);
}

void tag_invoke(boost::json::value_from_tag, boost::json::value& v,
                const RunSettings& s) {
  v = MembersToJson(s);
}

}  // namespace tether
