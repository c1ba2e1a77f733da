// HM-R2 checked where nothing else ran: a child process dlopen()s a plugin and calls its entry
// point, counting its threads before and after.
#pragma once

namespace hetmesh::cts {

// The child side: `hetmesh-cts --cts-entry-probe PLUGIN`. Prints "threads B -> A, same table Y|N"
// and exits 0 when the entry point started no thread and answered the same table twice, 1 when
// it did not, 2 when the plugin could not be opened.
int run_entry_probe(int argc, char** argv);

}  // namespace hetmesh::cts
