// Writing the job configuration (job_config.hpp) as TOML: every key with its effective value, in
// the syntax that parse_config reads back to an equal JobConfig.
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/toml_reader.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace hetmesh::afd {
namespace {

std::string toml_list(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const auto& item : items)
    quoted.push_back(toml_quote(item));
  return fmt::format("[{}]", fmt::join(quoted, ", "));
}

std::string toml_selectors(const std::vector<std::string>& selectors) {
  bool uniform = std::all_of(selectors.begin(), selectors.end(),
                             [&](const std::string& s) { return s == selectors.front(); });
  return uniform && !selectors.empty() ? toml_quote(selectors.front()) : toml_list(selectors);
}

// Shortest text that reads back to the same double, always with a fraction or exponent so TOML
// reads a float.
std::string toml_float(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

}  // namespace

std::string to_toml(const JobConfig& c) {
  std::string out = "# hetmesh job configuration (effective values)\n";
  out += fmt::format(
      "\n[job]\nattention = {}\nffn = {}\nmicro_batches = {}\nqueue_depth = {}\nlayers = {}\n"
      "gather = {}\ntopology = {}\ntimeout_ms = {}\njoin_timeout_ms = {}\nio_timeout_ms = "
      "{}\nheartbeat_ms = {}\n"
      "gather_window_ms = {}\n",
      c.job.attention, c.job.ffn, c.job.micro_batches, c.job.queue_depth, c.job.layers,
      toml_quote(to_string(c.job.gather)), toml_quote(to_string(c.job.topology)),
      c.job.timeout.count(), c.job.join_timeout.count(), c.job.io_timeout.count(),
      c.job.heartbeat.count(), c.job.gather_window.count());
  if (c.job.topology == JobTopology::map) {
    std::vector<std::string> lists;
    for (const std::vector<int>& ffns : c.job.ffns_of)
      lists.push_back(fmt::format("[{}]", fmt::join(ffns, ", ")));
    out += fmt::format("ffns_of = [{}]\n", fmt::join(lists, ", "));
  }
  out += fmt::format(
      "\n[model]\ntokens = {}\nhidden = {}\nexperts = {}\ntop_k = {}\na2f_dtype = {}\n"
      "f2a_dtype = {}\n",
      c.model.tokens, c.model.hidden, c.model.experts, c.model.top_k,
      toml_quote(to_string(c.model.a2f_dtype)), toml_quote(to_string(c.model.f2a_dtype)));
  if (!c.model.a2f_tensors.empty()) {
    out += "\n[model.a2f_tensors]\n";
    for (const TensorSection& t : c.model.a2f_tensors)
      out += fmt::format("{} = {{ dtype = {}, columns = {} }}\n", t.name,
                         toml_quote(to_string(t.dtype)), t.columns);
  }
  out += fmt::format("\n[devices]\nattention = {}\nffn = {}\n", toml_selectors(c.devices.attention),
                     toml_selectors(c.devices.ffn));
  out += fmt::format("\n[hosts]\nattention = {}\nffn = {}\nattention_nic = {}\nffn_nic = {}\n",
                     toml_selectors(c.hosts.attention), toml_selectors(c.hosts.ffn),
                     toml_selectors(c.hosts.attention_nic), toml_selectors(c.hosts.ffn_nic));
  out += fmt::format("\n[plugins]\npaths = {}\n", toml_list(c.plugins.paths));
  if (!c.plugins.options.empty()) {
    out += "\n[plugins.options]\n";
    for (const auto& [name, options] : c.plugins.options)
      out += fmt::format("{} = {}\n", name, toml_quote(options));
  }
  out += fmt::format(
      "\n[transport]\nkind = {}\nlisten_host = {}\nrdma_device = {}\ngid_index = {}\n"
      "staging_slots = {}\nstaging_slot_kib = {}\nprovider = {}\n",
      toml_quote(to_string(c.transport.kind)), toml_quote(c.transport.listen_host),
      toml_quote(c.transport.rdma_device), c.transport.gid_index, c.transport.staging_slots,
      c.transport.staging_slot_kib, toml_quote(c.transport.provider));
  if (c.transport.nics == std::vector<std::string>{"auto"})
    out += "nics = \"auto\"\n";
  else if (!c.transport.nics.empty())
    out += fmt::format("nics = {}\n", toml_list(c.transport.nics));
  out += fmt::format("\n[rendezvous]\nkind = {}\naddress = {}\nsecret_file = {}\n",
                     toml_quote(to_string(c.rendezvous.kind)), toml_quote(c.rendezvous.address),
                     toml_quote(c.rendezvous.secret_file));
  out += fmt::format("\n[tracing]\nenabled = {}\nchrome_trace = {}\nstraggler_factor = {}\n",
                     c.tracing.enabled, toml_quote(c.tracing.chrome_trace),
                     toml_float(c.tracing.straggler_factor));
  out += fmt::format("\n[metrics]\nlisten = {}\n", toml_quote(c.metrics.listen));
  out += fmt::format("\n[affinity]\ncomm_cpus = [{}]\npoller_cpu = {}\n",
                     fmt::join(c.affinity.comm_cpus, ", "), c.affinity.poller_cpu);
  return out;
}

}  // namespace hetmesh::afd
