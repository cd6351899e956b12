// Sanitizer defaults of every fuzz target: a UBSan finding stops the run
// (libFuzzer then saves the input as a crash) instead of being printed and
// passed over. ASAN_OPTIONS / UBSAN_OPTIONS in the environment still win.
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }
