// h2o-sys finds libh2o-llm; this crate's tests and examples also need its folder as an rpath so
// that they run without LD_LIBRARY_PATH (link arguments do not pass from one crate to another).
fn main() {
    if let Ok(dir) = std::env::var("DEP_H2O_LLM_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
