fn main() {
    let fds = protox::compile(["onnx.proto"], ["."]).expect("compile");
    let mut cfg = prost_build::Config::new();
    cfg.bytes(["."]);
    cfg.out_dir("out");
    std::fs::create_dir_all("out").unwrap();
    cfg.compile_fds(fds).expect("gen");
}
