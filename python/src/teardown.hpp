// Teardown from any thread, the interpreter's lock let go meanwhile. A thread that takes the lock
// back while the interpreter shuts down is ended with a forced unwind (pthread_exit), and no
// destructor may pass one (std::terminate): an application's daemon thread that dropped an engine
// as the program ended would abort the process. Such a thread parks instead, until the process
// ends (as Python 3.14 parks them itself).
#pragma once

#include <Python.h>

namespace hetmesh::python {

// Called once, at import, on any thread: remembers the main thread (the one that shuts the
// interpreter down, and may take its lock back then).
void remember_main_thread();

// Whether taking the interpreter's lock would end this thread now.
bool taking_the_lock_would_end_this_thread();

// Lets the interpreter's lock go for a destructor's blocking work, and takes it back at the end,
// or parks this thread where taking it back would end it.
class UnlockedTeardown {
 public:
  UnlockedTeardown() : state_(PyEval_SaveThread()) {}
  ~UnlockedTeardown();
  UnlockedTeardown(const UnlockedTeardown&) = delete;
  UnlockedTeardown& operator=(const UnlockedTeardown&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace hetmesh::python
