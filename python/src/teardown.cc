// Teardown without the interpreter's lock (teardown.hpp).
#include "teardown.hpp"

#include <pythread.h>
#include <unistd.h>

#include <atomic>

namespace hetmesh::python {
namespace {

std::atomic<unsigned long> main_thread{0};

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

}  // namespace

void remember_main_thread() {
  PyObject* threading = PyImport_ImportModule("threading");
  PyObject* main = threading ? PyObject_CallMethod(threading, "main_thread", nullptr) : nullptr;
  PyObject* ident = main ? PyObject_GetAttrString(main, "ident") : nullptr;
  if (ident) main_thread.store(PyLong_AsUnsignedLong(ident));
  Py_XDECREF(ident);
  Py_XDECREF(main);
  Py_XDECREF(threading);
  PyErr_Clear();  // without it, every thread is taken for another than the main one
}

bool taking_the_lock_would_end_this_thread() {
  return interpreter_finalizing() && PyThread_get_thread_ident() != main_thread.load();
}

UnlockedTeardown::~UnlockedTeardown() {
  if (taking_the_lock_would_end_this_thread())
    for (;;)
      pause();
  PyEval_RestoreThread(state_);
}

}  // namespace hetmesh::python
