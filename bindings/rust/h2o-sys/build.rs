// Finds libh2o-llm: $H2O_LIB_DIR, else what `pkg-config --libs h2o-llm` says (when pkg-config is
// installed and knows the library), else the repository's build/ folder. A library found nowhere
// fails the build with the places looked at, rather than leaving the error to the linker.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=H2O_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rustc-link-lib=dylib=h2o-llm");

    let dir = if let Some(dir) = std::env::var_os("H2O_LIB_DIR").filter(|d| !d.is_empty()) {
        Some(PathBuf::from(dir))
    } else if let Some(dirs) = pkg_config_dirs() {
        // pkg-config knows the library; with no -L it is in the linker's default path.
        dirs.into_iter().next()
    } else {
        let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
        let build = manifest.join("../../../build");
        if !build.join("libh2o-llm.so").exists() {
            panic!(
                "libh2o-llm.so not found: set H2O_LIB_DIR to its folder, install it with a pkg-config \
                 file named h2o-llm, or build it with `scripts/build.sh build` (looked in {})",
                build.display()
            );
        }
        Some(build.canonicalize().unwrap())
    };
    if let Some(dir) = dir {
        println!("cargo:rustc-link-search=native={}", dir.display());
        // The runtime linker must find the library too: an rpath for this crate's tests, and the
        // folder for dependents' build scripts (DEP_H2O_LLM_LIB_DIR) to do the same.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        println!("cargo:lib_dir={}", dir.display());
    }
}

/// The -L folders of `pkg-config --libs h2o-llm`, or None when pkg-config is absent or does not
/// know the library.
fn pkg_config_dirs() -> Option<Vec<PathBuf>> {
    let out = Command::new("pkg-config").args(["--libs", "h2o-llm"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some(text.split_whitespace().filter_map(|f| f.strip_prefix("-L")).map(PathBuf::from).collect())
}
