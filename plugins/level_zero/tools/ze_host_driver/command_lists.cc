// Immediate command lists. Each list has a worker thread that runs its appended commands in order:
// wait for the command's wait events, do its work through the writable views, signal its event.
// Appends return at once (asynchronous) unless the list was created SYNCHRONOUS. A command that
// waits (on an event, or on memory) blocks only its own list.
//
// zeCommandListDestroy with work still pending waits for it up to kDestroyDrain (10 s). If the work
// is stuck (say on an event nobody signals), the list is abandoned: the worker is told to stop,
// drops its remaining commands (their events are never signaled) and is left detached. It owns
// references to the list, and the commands to their allocations and events, so nothing it uses is
// freed under it.
#include <cstring>

#include "state.h"

namespace hetmesh_ze {
namespace {

constexpr auto kDestroyDrain = std::chrono::seconds(10);

using Clock = std::chrono::steady_clock;

// Appends a command built by the caller, after resolving the signal event and wait list.
ze_result_t append(ze_command_list_handle_t handle, ze_event_handle_t signal, uint32_t num_waits,
                   const ze_event_handle_t* waits, Operation op) {
  std::shared_ptr<CommandList> list;
  if (auto r = check_list(handle, list); r != ZE_RESULT_SUCCESS) return r;
  Command command;
  if (auto r = event_args(signal, num_waits, waits, command.signal, command.waits);
      r != ZE_RESULT_SUCCESS) {
    return r;
  }
  command.op = std::move(op);
  return list->submit(std::move(command));
}

bool power_of_two(size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

}  // namespace

Registry<CommandList>& command_lists() {
  static auto* registry = new Registry<CommandList>;
  return *registry;
}

ze_result_t check_list(ze_command_list_handle_t handle, std::shared_ptr<CommandList>& out) {
  return lookup(command_lists(), handle, out);
}

ze_result_t CommandList::submit(Command command) {
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    if (stop.load()) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    queue_.push_back(std::move(command));
    ticket = ++submitted_;
  }
  work_cv_.notify_one();
  if (synchronous) {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return completed_ >= ticket || stop.load(); });
  }
  return ZE_RESULT_SUCCESS;
}

void CommandList::run() {
  for (;;) {
    Command command;
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] { return stop.load() || !queue_.empty(); });
      if (stop.load()) {
        queue_.clear();  // abandoned (or destroyed when idle): pending commands are dropped
        break;
      }
      command = std::move(queue_.front());
      queue_.pop_front();
    }
    bool done = true;
    for (auto& event : command.waits) {
      if (!event->wait(Clock::time_point::max(), &stop)) {
        done = false;
        break;
      }
    }
    if (done && command.op) {
      try {
        done = command.op(stop);
      } catch (...) {
        done = false;  // nothing may escape the worker; the command's event stays unsignaled
      }
    }
    if (done && command.signal) command.signal->signal();
    command = Command{};  // release allocations and events before reporting completion
    {
      std::lock_guard lock(mutex_);
      ++completed_;
    }
    done_cv_.notify_all();
  }
  done_cv_.notify_all();
}

bool CommandList::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return done_cv_.wait_for(lock, timeout, [&] { return completed_ == submitted_; });
}

void CommandList::request_stop() {
  {
    std::lock_guard lock(mutex_);
    stop.store(true);
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
}

ze_result_t ZE_APICALL CommandListCreateImmediate(ze_context_handle_t context,
                                                  ze_device_handle_t device_handle,
                                                  const ze_command_queue_desc_t* desc,
                                                  ze_command_list_handle_t* out) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    Device* device = nullptr;
    if (auto r = check_device(device_handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->ordinal >= kQueueGroupCount || desc->index != 0) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // two groups, one queue each
    }
    if (desc->mode > ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    auto list = std::make_shared<CommandList>();
    list->device = device;
    list->context = context;
    list->ordinal = desc->ordinal;
    list->synchronous = desc->mode == ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS;
    // The worker owns a reference: an abandoned list outlives its handle (see the top).
    list->worker = std::thread([list] { list->run(); });
    *out = static_cast<ze_command_list_handle_t>(command_lists().add(std::move(list)));
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL CommandListDestroy(ze_command_list_handle_t handle) {
  return guarded([&] {
    if (handle == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    auto list = command_lists().remove(handle);
    if (!list) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    const bool drained = list->drain(kDestroyDrain);
    list->request_stop();
    if (drained && list->worker.get_id() != std::this_thread::get_id()) {
      list->worker.join();
    } else {
      list->worker.detach();
    }
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL CommandListAppendWriteGlobalTimestamp(ze_command_list_handle_t list,
                                                             uint64_t* dst,
                                                             ze_event_handle_t signal,
                                                             uint32_t num_waits,
                                                             ze_event_handle_t* waits) {
  return guarded([&] {
    if (list == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    Span span;
    if (auto r = resolve(dst, sizeof(uint64_t), span); r != ZE_RESULT_SUCCESS) return r;
    if (reinterpret_cast<uintptr_t>(dst) % alignof(uint64_t) != 0) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    return append(list, signal, num_waits, waits, [span](const std::atomic<bool>&) {
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(span.rw))
          .store(now_ns(), std::memory_order_release);
      return true;
    });
  });
}

ze_result_t ZE_APICALL CommandListAppendBarrier(ze_command_list_handle_t list,
                                                ze_event_handle_t signal, uint32_t num_waits,
                                                ze_event_handle_t* waits) {
  // The list is in order: a barrier is its waits and its signal.
  return guarded([&] { return append(list, signal, num_waits, waits, nullptr); });
}

ze_result_t ZE_APICALL CommandListAppendMemoryCopy(ze_command_list_handle_t list, void* dst,
                                                   const void* src, size_t size,
                                                   ze_event_handle_t signal, uint32_t num_waits,
                                                   ze_event_handle_t* waits) {
  return guarded([&] {
    if (list == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    Span to;
    Span from;
    if (auto r = resolve(dst, size, to); r != ZE_RESULT_SUCCESS) return r;
    if (auto r = resolve(src, size, from); r != ZE_RESULT_SUCCESS) return r;
    return append(list, signal, num_waits, waits, [to, from, size](const std::atomic<bool>&) {
      if (size > 0) std::memmove(to.rw, from.rw, size);
      return true;
    });
  });
}

ze_result_t ZE_APICALL CommandListAppendMemoryFill(ze_command_list_handle_t list, void* ptr,
                                                   const void* pattern, size_t pattern_size,
                                                   size_t size, ze_event_handle_t signal,
                                                   uint32_t num_waits, ze_event_handle_t* waits) {
  return guarded([&] {
    if (list == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (pattern == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (!power_of_two(pattern_size) || pattern_size > kMaxFillPatternSize) {
      return ZE_RESULT_ERROR_INVALID_SIZE;
    }
    Span span;
    if (auto r = resolve(ptr, size, span); r != ZE_RESULT_SUCCESS) return r;
    // Copied now: the caller may reuse its pattern as soon as the append returns.
    std::vector<std::byte> bytes(static_cast<const std::byte*>(pattern),
                                 static_cast<const std::byte*>(pattern) + pattern_size);
    return append(list, signal, num_waits, waits,
                  [span, size, bytes = std::move(bytes)](const std::atomic<bool>&) {
                    if (bytes.size() == 1) {
                      std::memset(span.rw, std::to_integer<int>(bytes[0]), size);
                      return true;
                    }
                    // A trailing partial pattern gets the pattern's first bytes.
                    for (size_t done = 0; done < size; done += bytes.size()) {
                      const size_t n = size - done < bytes.size() ? size - done : bytes.size();
                      std::memcpy(span.rw + done, bytes.data(), n);
                    }
                    return true;
                  });
  });
}

ze_result_t ZE_APICALL CommandListAppendSignalEvent(ze_command_list_handle_t list,
                                                    ze_event_handle_t event) {
  return guarded([&] {
    if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    return append(list, event, 0, nullptr, nullptr);
  });
}

ze_result_t ZE_APICALL CommandListAppendWaitOnEvents(ze_command_list_handle_t list,
                                                     uint32_t num_events,
                                                     ze_event_handle_t* events_to_wait) {
  return guarded([&] { return append(list, nullptr, num_events, events_to_wait, nullptr); });
}

ze_result_t ZE_APICALL CommandListAppendEventReset(ze_command_list_handle_t list,
                                                   ze_event_handle_t handle) {
  return guarded([&] {
    std::shared_ptr<Event> event;
    if (auto r = lookup(events(), handle, event); r != ZE_RESULT_SUCCESS) return r;
    return append(list, nullptr, 0, nullptr, [event](const std::atomic<bool>&) {
      event->reset();
      return true;
    });
  });
}

}  // namespace hetmesh_ze
