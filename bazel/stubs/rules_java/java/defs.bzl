"""Offline stub of rules_java: the names Bazel 4.2's own tools load, forwarded to the native rules."""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_lite_proto_library = native.java_lite_proto_library
java_proto_library = native.java_proto_library
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
java_plugin = native.java_plugin
