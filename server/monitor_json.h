// The dashboard's JSON documents and WebSocket messages (web/API.md), built
// from the Monitor's state as Boost.JSON values; the Monitor serializes each
// once, with JsonText (json_text.h).
//
// Pure functions of `state` (and `now`, where ages and uptime come in): not
// thread-safe on their own; the Monitor calls them with its mutex held.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <cstdint>
#include <optional>
#include <string_view>

#include "server/monitor_state.h"

namespace tether {

// The documents of web/API.md, one each.
boost::json::object StatusJson(const MonitorState& state,
                               MonitorState::TimePoint now);
boost::json::array WorkersJson(const MonitorState& state);
boost::json::array ShardsJson(const MonitorState& state,
                              MonitorState::TimePoint now);
boost::json::object CheckpointsJson(const MonitorState& state);
boost::json::object ConfigJson(const MonitorState& state);
// The history points with seq > after_seq, oldest first.
boost::json::array PointsJson(const MonitorState& state, uint64_t after_seq);
// The events with after_seq < seq <= up_to, oldest first.
boost::json::array EventsJson(const MonitorState& state, uint64_t after_seq,
                              uint64_t up_to = UINT64_MAX);

// What GET /api/`name` answers (status, workers, shards, checkpoints,
// config, history, events); nullopt for an unknown name.
std::optional<boost::json::value> DocumentJson(const MonitorState& state,
                                               std::string_view name,
                                               MonitorState::TimePoint now);

// The WebSocket "snapshot": everything, the whole history and the events
// up to the last update included.
boost::json::object SnapshotJson(const MonitorState& state,
                                 MonitorState::TimePoint now);
// The WebSocket "update": the history points and events after those the
// previous update carried (state.sent_point_seq, state.sent_event_seq), and
// the config when state.config_changed. It changes nothing: the caller
// records what it sent.
boost::json::object UpdateJson(const MonitorState& state,
                               MonitorState::TimePoint now);

}  // namespace tether
