//! Checks every struct of this crate against the C header: a C program compiled here with the
//! system compiler (`cc`, or $CC) prints sizeof and offsetof of the same fields, so the Rust
//! declarations cannot drift from include/h2o/h2o.h unnoticed.
use h2o_sys::*;
use std::mem::{size_of, MaybeUninit};
use std::path::PathBuf;
use std::process::Command;

struct Layout {
    name: &'static str,
    size: usize,
    fields: Vec<(&'static str, usize)>,
}

// A field's C name: its Rust name unless given (`type_` is `type` in C).
macro_rules! c_name {
    ($f:ident) => {
        stringify!($f)
    };
    ($f:ident, $c:literal) => {
        $c
    };
}

// A field's offset. std::mem::offset_of! needs Rust 1.77; the crates support Debian 12's 1.63.
// addr_of! takes the field's address without reading or referencing the uninitialized value.
macro_rules! offset_of {
    ($s:ident, $f:ident) => {{
        let value = MaybeUninit::<$s>::uninit();
        let base = value.as_ptr();
        let field = unsafe { std::ptr::addr_of!((*base).$f) };
        field as usize - base as usize
    }};
}

macro_rules! layout {
    ($s:ident { $($f:ident $(= $c:literal)?),* $(,)? }) => {
        Layout {
            name: stringify!($s),
            size: size_of::<$s>(),
            fields: vec![$((c_name!($f $(, $c)?), offset_of!($s, $f))),*],
        }
    };
}

fn rust_layouts() -> Vec<Layout> {
    vec![
        layout!(h2o_model_params { struct_size, tokenizer_path, progress, progress_user_data, prefix_cache_bytes, prefix_cache_policy }),
        layout!(h2o_model_info {
            struct_size,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            n_ff,
            head_dim,
            bos_token,
            eos_token,
            n_params,
            weight_bytes
        }),
        layout!(h2o_prefix_cache_stats { struct_size, entries, bytes, hits, misses }),
        layout!(h2o_chat_message { role, role_len, content, content_len }),
        layout!(h2o_backend_info { struct_size, kind, device_index, name, device_type, memory_bytes }),
        layout!(h2o_session_params {
            struct_size,
            n_ctx,
            n_threads,
            n_batch,
            seed,
            kv_budget,
            kv_policy,
            kv_recent,
            kv_recent_ratio,
            kv_sinks,
            position_rolling,
            backend,
            device_index,
            kv_type,
            max_memory_bytes,
            kv_horizon,
            experimental,
            kv_overflow
        }),
        layout!(h2o_kv_layout { struct_size, budget, policy, recent, sinks, heavy, position_rolling,
                                type_ = "type", n_ctx, horizon, min_layer_budget, max_layer_budget, min_head_budget }),
        layout!(h2o_kv_policy_info {
            struct_size,
            policy,
            name,
            gathers_statistics,
            has_recent_window,
            keeps_sinks,
            default_recent_ratio,
            default_horizon
        }),
        layout!(h2o_device_traffic { struct_size, bytes_to_device, bytes_to_host, submissions, device_memory_bytes }),
        layout!(h2o_memory_report { struct_size, weight_bytes, kv_bytes, scratch_bytes }),
        layout!(h2o_span_info {
            struct_size,
            span_id,
            min_share,
            min_tokens,
            n_tokens,
            kept_min,
            kept_max,
            kept_mean,
            attention_share
        }),
        layout!(h2o_generate_params {
            struct_size,
            max_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            stop_strings,
            n_stop_strings,
            stop_at_eos,
            grammar,
            grammar_len,
            json_schema,
            json_schema_len,
            logit_bias_tokens,
            logit_bias_values,
            n_logit_bias
        }),
        layout!(h2o_kv_usage { struct_size, capacity, n_past, n_held, n_evicted, n_pinned, evicting_since, evicts }),
        layout!(h2o_generate_stats {
            struct_size,
            n_prompt_tokens,
            n_generated_tokens,
            stop_reason,
            n_past,
            prompt_seconds,
            generate_seconds
        }),
    ]
}

/// Compiles and runs a C program printing "STRUCT sizeof N" and "STRUCT FIELD N" lines.
fn c_layout_lines(layouts: &[Layout]) -> Vec<String> {
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include");
    let mut src = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"h2o/h2o.h\"\nint main(void) {\n");
    for l in layouts {
        src += &format!("printf(\"{0} sizeof %zu\\n\", sizeof({0}));\n", l.name);
        for (f, _) in &l.fields {
            src += &format!("printf(\"{0} {1} %zu\\n\", offsetof({0}, {1}));\n", l.name, f);
        }
    }
    src += "return 0;\n}\n";

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (c_file, exe) = (dir.join("h2o_layout.c"), dir.join("h2o_layout"));
    std::fs::write(&c_file, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg("-I")
        .arg(&include)
        .arg(&c_file)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler '{cc}' (needed to read the header's layouts): {e}"));
    assert!(status.success(), "compiling the layout program against {} failed", include.display());
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn struct_layouts_match_the_c_header() {
    let layouts = rust_layouts();
    let mut expected = Vec::new();
    for l in &layouts {
        expected.push(format!("{} sizeof {}", l.name, l.size));
        for (f, offset) in &l.fields {
            expected.push(format!("{} {} {}", l.name, f, offset));
        }
    }
    assert_eq!(c_layout_lines(&layouts), expected);
}

#[test]
fn header_version_matches() {
    let header =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/h2o/h2o.h")).unwrap();
    let number = |name: &str| -> u32 {
        let line = header.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    let declared =
        number("H2O_VERSION_MAJOR") * 10000 + number("H2O_VERSION_MINOR") * 100 + number("H2O_VERSION_PATCH");
    assert_eq!(H2O_VERSION_NUMBER, declared, "h2o-sys was written for another version of h2o.h");
}

#[test]
fn abi_version_and_experimental_capacity_match() {
    let header =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/h2o/h2o.h")).unwrap();
    let number = |name: &str| -> u32 {
        let line = header.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    assert_eq!(number("H2O_ABI_VERSION"), H2O_ABI_VERSION);
    assert_eq!(number("H2O_EXPERIMENTAL_CAPACITY") as usize, H2O_EXPERIMENTAL_CAPACITY);
}

#[test]
fn span_limit_matches() {
    // A #define, so the layout program does not see it: read from the header as the version is.
    let header =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/h2o/h2o.h")).unwrap();
    let line = header.lines().find(|l| l.starts_with("#define H2O_MAX_SPANS ")).unwrap();
    assert_eq!(line.split_whitespace().nth(2).unwrap().parse::<u32>().unwrap(), H2O_MAX_SPANS);
}
