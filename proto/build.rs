//! Compiles `proto/meta.proto` with protox (a pure-Rust protobuf compiler, so a
//! fresh machine needs no `protoc`) and generates the prost structs from it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/meta.proto");
    let descriptors = protox::compile(["meta.proto"], ["proto"])?;
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
