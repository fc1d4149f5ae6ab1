#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *fast_add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}

static PyMethodDef methods[] = {
    {"add", fast_add, METH_VARARGS, "add(a, b) -> a + b"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fast", "Tiny clean C extension.", -1, methods};

PyMODINIT_FUNC PyInit__fast(void) { return PyModule_Create(&module); }
