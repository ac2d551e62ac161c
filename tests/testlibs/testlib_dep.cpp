// The dependency of testlib_missing_dep (see testlib_plugins.cpp), built where no loader looks.
extern "C" __attribute__((visibility("default"))) int testlib_dep_value() { return 7; }
