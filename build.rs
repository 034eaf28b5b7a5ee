//! With the `sim` feature: parse the Kubernetes `.proto` files in `proto/` into a descriptor
//! set (`$OUT_DIR/k8s.fds`) for the simulated server's protobuf bodies (`src/sim/pb.rs`).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=proto");
    #[cfg(feature = "sim")]
    sim::descriptors();
}

#[cfg(feature = "sim")]
mod sim {
    use std::path::{Path, PathBuf};

    /// Every `generated.proto` under `proto/`.
    fn protos(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                protos(&p, out);
            } else if p.extension().is_some_and(|x| x == "proto") {
                out.push(p);
            }
        }
    }

    pub fn descriptors() {
        use protobuf::Message as _;
        let mut inputs = Vec::new();
        protos(Path::new("proto"), &mut inputs);
        let fds = protobuf_parse::Parser::new()
            .pure()
            .include("proto")
            .inputs(&inputs)
            .file_descriptor_set()
            .unwrap_or_else(|e| panic!("parsing proto/: {e:#}"));
        let bytes = fds
            .write_to_bytes()
            .unwrap_or_else(|e| panic!("encoding the descriptors: {e}"));
        let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("k8s.fds");
        std::fs::write(&out, bytes).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    }
}
