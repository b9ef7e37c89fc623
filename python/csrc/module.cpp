// The Python module hdk._C. Importing it loads the shared object, whose static initializers
// register the torch ops (torch.ops.hdk.*); the module itself only reports how it was built.
// Plain CPython API: the ops go through torch's dispatcher, so no pybind11 is needed here.
#include <Python.h>

#include "hdk/version.h"
#include "torch_glue.h"

namespace {

PyObject* library_version(PyObject*, PyObject*) {
  return PyUnicode_FromString(hdk::version());
}

PyObject* built_with_cuda(PyObject*, PyObject*) {
  return PyBool_FromLong(hdk::built_with_cuda() ? 1 : 0);
}

PyObject* extension_has_cuda(PyObject*, PyObject*) {
  return PyBool_FromLong(hdk_python::extension_has_cuda() ? 1 : 0);
}

PyMethodDef module_methods[] = {
    {"library_version", library_version, METH_NOARGS,
     "Version of the libhdk this extension contains or links."},
    {"built_with_cuda", built_with_cuda, METH_NOARGS,
     "True when libhdk contains the CUDA backend."},
    {"extension_has_cuda", extension_has_cuda, METH_NOARGS,
     "True when the torch binding was compiled with CUDA support (current-stream, device guard)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    "_C",
    "hdk's torch extension: registers torch.ops.hdk.*",
    -1,
    module_methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__C() {
  return PyModule_Create(&module_definition);
}
