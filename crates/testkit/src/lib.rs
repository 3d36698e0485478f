//! oxgen-testkit: Test support: the ONNX node-test runner and fixture builders
