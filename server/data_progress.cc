#include "server/data_progress.h"

#include <algorithm>
#include <boost/json.hpp>

namespace tether {
namespace json = boost::json;
namespace {

// Ascending indices as [first, last] ranges.
json::array Ranges(const std::vector<uint32_t>& indices) {
  json::array ranges;
  for (size_t i = 0; i < indices.size();) {
    size_t j = i;
    while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
    ranges.push_back(json::array{indices[i], indices[j]});
    i = j + 1;
  }
  return ranges;
}

template <typename T>
T Get(const json::object& o, std::string_view key) {
  return json::value_to<T>(o.at(key));
}

}  // namespace

std::string DataProgressToJson(const DataProgress& progress) {
  json::object out;
  if (progress.chunks) {
    const ChunkPool::Progress& c = *progress.chunks;
    json::array done, partial;
    for (const auto& epoch : c.done) done.push_back(Ranges(epoch));
    for (const auto& epoch : c.partial) {
      json::array chunks;
      for (const auto& [index, rows] : epoch) {
        chunks.push_back(json::array{index, rows});
      }
      partial.push_back(std::move(chunks));
    }
    out["chunks"] = json::object{{"rows", c.rows},
                                 {"chunk_rows", c.chunk_rows},
                                 {"epochs", c.epochs},
                                 {"done", std::move(done)},
                                 {"partial", std::move(partial)}};
  }
  json::array shares;
  for (const auto& [epoch, plan] : progress.shares) {
    json::array members, started, batch;
    for (int m : plan.members) members.push_back(m);
    for (int64_t s : plan.started) started.push_back(s);
    for (uint32_t b : plan.batch) batch.push_back(b);
    shares.push_back(json::object{{"epoch", epoch},
                                  {"members", std::move(members)},
                                  {"started", std::move(started)},
                                  {"batch", std::move(batch)}});
  }
  out["shares"] = std::move(shares);
  json::array leftovers;
  for (const SharePlans::Leftover& l : progress.leftovers) {
    leftovers.push_back(json::array{l.epoch, l.index, l.members, l.first_row});
  }
  out["leftovers"] = std::move(leftovers);
  return json::serialize(out);
}

Result<DataProgress> DataProgressFromJson(std::string_view text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return Corruption("data progress is not JSON (" + ec.message() + ")");
  DataProgress progress;
  try {
    const json::object& o = v.as_object();
    if (const json::value* c = o.if_contains("chunks")) {
      const json::object& co = c->as_object();
      ChunkPool::Progress chunks;
      chunks.rows = Get<uint64_t>(co, "rows");
      chunks.chunk_rows = Get<uint32_t>(co, "chunk_rows");
      chunks.epochs = Get<int>(co, "epochs");
      for (const json::value& epoch : co.at("done").as_array()) {
        std::vector<uint32_t> indices;
        for (const json::value& range : epoch.as_array()) {
          const auto first = json::value_to<uint32_t>(range.as_array().at(0));
          const auto last = json::value_to<uint32_t>(range.as_array().at(1));
          if (last < first || last - first > ChunkPool::kMaxChunks) {
            return Corruption("data progress: chunk range [" +
                              std::to_string(first) + ", " +
                              std::to_string(last) + "] is not a range");
          }
          for (uint64_t i = first; i <= last; ++i) {
            indices.push_back(static_cast<uint32_t>(i));
          }
        }
        chunks.done.push_back(std::move(indices));
      }
      if (const json::value* partial = co.if_contains("partial")) {
        for (const json::value& epoch : partial->as_array()) {
          std::map<uint32_t, uint32_t> rows;
          for (const json::value& pair : epoch.as_array()) {
            rows[json::value_to<uint32_t>(pair.as_array().at(0))] =
                json::value_to<uint32_t>(pair.as_array().at(1));
          }
          chunks.partial.push_back(std::move(rows));
        }
      }
      progress.chunks = std::move(chunks);
    }
    for (const json::value& sv : o.at("shares").as_array()) {
      const json::object& so = sv.as_object();
      SharePlans::Plan plan;
      plan.members = json::value_to<std::vector<int>>(so.at("members"));
      plan.started = json::value_to<std::vector<int64_t>>(so.at("started"));
      if (const json::value* batch = so.if_contains("batch")) {
        plan.batch = json::value_to<std::vector<uint32_t>>(*batch);
      }
      plan.batch.resize(plan.members.size(), 0);
      if (!std::is_sorted(plan.members.begin(), plan.members.end())) {
        return Corruption(
            "data progress: a share plan's members are not in "
            "ascending order");
      }
      if (plan.started.size() != plan.members.size()) {
        return Corruption(
            "data progress: a share plan's members and start "
            "clocks differ in number");
      }
      progress.shares[Get<int>(so, "epoch")] = std::move(plan);
    }
    if (const json::value* leftovers = o.if_contains("leftovers")) {
      for (const json::value& lv : leftovers->as_array()) {
        const json::array& l = lv.as_array();
        SharePlans::Leftover leftover;
        leftover.epoch = json::value_to<int>(l.at(0));
        leftover.index = json::value_to<int>(l.at(1));
        leftover.members = json::value_to<int>(l.at(2));
        leftover.first_row = json::value_to<uint64_t>(l.at(3));
        if (leftover.epoch < 0 || leftover.index < 0 ||
            leftover.index >= leftover.members) {
          return Corruption("data progress: leftover of member " +
                            std::to_string(leftover.index) + " of " +
                            std::to_string(leftover.members) + " in epoch " +
                            std::to_string(leftover.epoch) + " is not a share");
        }
        progress.leftovers.push_back(leftover);
      }
    }
  } catch (const std::exception& e) {
    return Corruption(std::string("data progress: ") + e.what());
  }
  return progress;
}

}  // namespace tether
