//! With the `embedded-dashboard` feature: builds the dashboard (the workspace's `web/` crate,
//! with Trunk, as `scripts/build-dashboard` does) into `$OUT_DIR/dashboard`, which
//! `http::dashboard` compiles into the binary. Without the feature it does nothing.
//!
//! Hand-written because no crate runs Trunk from a build script; it fails with what to install
//! when Trunk is missing, rather than building a binary without its dashboard.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_EMBEDDED_DASHBOARD").is_none() {
        return;
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("server/ sits in the workspace");
    let trunk_config = root.join("Trunk.toml");
    if !trunk_config.is_file() || !root.join("web/index.html").is_file() {
        fail(&format!(
            "the embedded-dashboard feature builds the dashboard from the workspace's web/ crate, \
             which is not in {}; build from a checkout of the repository",
            root.display()
        ));
    }
    for input in [
        "web/src",
        "web/index.html",
        "web/style.css",
        "web/Cargo.toml",
        "shared/src",
        "shared/Cargo.toml",
        "Trunk.toml",
        "Cargo.lock",
    ] {
        println!("cargo::rerun-if-changed={}", root.join(input).display());
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let dist = out_dir.join("dashboard");
    // Trunk's cargo builds in this build's target directory (the first ancestor of OUT_DIR
    // with cargo's CACHEDIR.TAG), where scripts/build-dashboard builds too, so a dashboard
    // built there is not built again. It cannot wait on this build: the `dashboard` profile it
    // builds has directories, and locks, of its own.
    let target_dir = out_dir
        .ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map_or_else(|| out_dir.join("target"), Path::to_path_buf);

    // Trunk.toml builds offline (Trunk must not download tools), so the web crate's
    // dependencies, which this build did not need, are fetched first.
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut fetch = Command::new(cargo);
    fetch
        .current_dir(root)
        .args(["fetch", "--quiet", "--manifest-path"])
        .arg(root.join("Cargo.toml"));
    scrub(&mut fetch);
    match fetch.status() {
        Ok(status) if status.success() => {}
        outcome => fail(&format!(
            "cargo fetch of the dashboard's dependencies failed: {outcome:?}"
        )),
    }

    let mut trunk = Command::new("trunk");
    trunk
        .current_dir(root)
        .args(["build", "--release", "--config"])
        .arg(&trunk_config)
        .arg("--dist")
        .arg(&dist)
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("PATH", path_with_tools(root))
        // Trunk's update check needs the network; the build itself does not.
        .env("TRUNK_SKIP_VERSION_CHECK", "true");
    scrub(&mut trunk);
    match trunk.status() {
        Ok(status) if status.success() => {}
        Ok(status) => fail(&format!(
            "trunk build of the dashboard failed ({status}); its output is above. Building \
             without --features embedded-dashboard gives a server that serves web/dist instead"
        )),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => fail(
            "the embedded-dashboard feature needs trunk 0.21.14, wasm-bindgen-cli 0.2.129 and \
             wasm-opt 132 on PATH, and trunk is not there: run scripts/setup --serve (or see \
             the README), or build without --features embedded-dashboard",
        ),
        Err(error) => fail(&format!("could not run trunk: {error}")),
    }
    if !dist.join("index.html").is_file() {
        fail(&format!(
            "trunk build finished without {}",
            dist.join("index.html").display()
        ));
    }
}

/// `PATH` with the workspace's `.tools/` (where scripts/setup puts wasm-opt) in front.
fn path_with_tools(root: &Path) -> OsString {
    let tools = root.join(".tools/node_modules/.bin");
    let rest = env::var_os("PATH").unwrap_or_default();
    env::join_paths(std::iter::once(tools).chain(env::split_paths(&rest))).unwrap_or(rest)
}

/// Removes from `command`'s environment what describes this build script's build.
fn scrub(command: &mut Command) {
    for (name, _) in env::vars_os() {
        if describes_this_build(&name) {
            command.env_remove(name);
        }
    }
}

/// Whether `name` is one of the variables cargo sets for this build script, which would leak
/// into the dashboard's nested cargo build: an empty `CARGO_ENCODED_RUSTFLAGS` there replaces
/// the flags it should get, and this host's `CARGO_CFG_*` would describe the wrong target to
/// the wasm build's own build scripts.
fn describes_this_build(name: &OsString) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    [
        "CARGO_CFG_",
        "CARGO_FEATURE_",
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
        || [
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_MAKEFLAGS",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_CRATE_NAME",
            "TARGET",
            "HOST",
            "OUT_DIR",
            "PROFILE",
            "OPT_LEVEL",
            "DEBUG",
            "NUM_JOBS",
            "RUSTC_LINKER",
        ]
        .contains(&name)
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}
