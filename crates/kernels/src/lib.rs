//! oxgen-kernels: CPU kernels: scalar references with the thread pool they run on; no ONNX, no graph
