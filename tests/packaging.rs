//! What the manifests promise: the workspace's `rust-version` covers every
//! locked dependency (no other toolchain can be installed to check it by
//! building, so the lockfile is read instead), and `airlock-core` builds
//! from its own package, with nothing reaching outside the crate.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn metadata() -> serde_json::Value {
    // Only this platform's dependencies are in the local cache; the others
    // cannot be built here either.
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--locked", "--filter-platform"])
        .arg(host_triple())
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

fn host_triple() -> String {
    let out = Command::new("rustc").arg("-vV").output().expect("rustc -vV runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// `1.85`, `1.85.0` → (1, 85, 0).
fn version(v: &str) -> (u64, u64, u64) {
    let mut parts =
        v.split('.').map(|p| p.parse::<u64>().unwrap_or_else(|_| panic!("bad rust-version {v:?}")));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// What a package needs: its `rust-version`, or at least what its edition
/// needs when it declares none.
fn needs(package: &serde_json::Value) -> Option<(u64, u64, u64)> {
    let declared = package["rust_version"].as_str().map(version);
    let edition = match package["edition"].as_str() {
        Some("2024") => Some((1, 85, 0)),
        Some("2021") => Some((1, 56, 0)),
        _ => None,
    };
    declared.max(edition)
}

#[test]
fn workspace_rust_version_covers_every_locked_dependency() {
    let meta = metadata();
    let members: Vec<&str> =
        meta["workspace_members"].as_array().expect("members").iter().filter_map(|m| m.as_str()).collect();
    let packages = meta["packages"].as_array().expect("packages");
    let ours: Vec<&serde_json::Value> =
        packages.iter().filter(|p| members.contains(&p["id"].as_str().unwrap_or(""))).collect();
    assert!(!ours.is_empty(), "no workspace member in cargo metadata");
    let declared = ours
        .iter()
        .map(|p| {
            p["rust_version"]
                .as_str()
                .map(version)
                .unwrap_or_else(|| panic!("{} has no rust-version", p["name"]))
        })
        .min()
        .expect("a member");
    let mut too_new: Vec<String> = packages
        .iter()
        .filter(|p| !members.contains(&p["id"].as_str().unwrap_or("")))
        .filter_map(|p| {
            needs(p).filter(|n| *n > declared).map(|n| format!("{} {} needs {n:?}", p["name"], p["version"]))
        })
        .collect();
    too_new.sort();
    assert!(
        too_new.is_empty(),
        "the workspace declares rust-version {declared:?} but the lockfile holds:\n{}",
        too_new.join("\n")
    );
}

#[test]
fn core_builds_from_its_own_package() {
    let target = root().join("target/standalone-core");
    let out = Command::new(env!("CARGO"))
        .args(["package", "-p", "airlock-core", "--offline", "--no-verify", "--allow-dirty", "--target-dir"])
        .arg(&target)
        .current_dir(root())
        .output()
        .expect("cargo package runs");
    assert!(out.status.success(), "cargo package failed: {}", String::from_utf8_lossy(&out.stderr));
    // Outside the repository, or cargo takes it for a stray workspace member.
    let scratch = tempfile::tempdir().expect("scratch dir");
    let unpacked = scratch.path();
    let crate_file = target.join("package").join(format!("airlock-core-{}.crate", core_version()));
    let tar =
        Command::new("tar").arg("xzf").arg(&crate_file).current_dir(unpacked).status().expect("tar runs");
    assert!(tar.success(), "could not unpack {}", crate_file.display());
    let dir = unpacked.join(format!("airlock-core-{}", core_version()));
    // The workspace's lockfile pins the versions the package resolves to,
    // so the build needs nothing from the network.
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).expect("copy Cargo.lock");
    // The unpacked sources keep their old mtimes, so a cached build of the
    // crate would pass for fresh: only its dependencies stay cached.
    let clean = Command::new(env!("CARGO"))
        .args(["clean", "--offline", "-p", "airlock-core", "--target-dir"])
        .arg(target.join("build"))
        .current_dir(&dir)
        .status()
        .expect("cargo clean runs");
    assert!(clean.success(), "cargo clean -p airlock-core failed");
    let build = Command::new(env!("CARGO"))
        .args(["build", "--offline", "--lib", "--target-dir"])
        .arg(target.join("build"))
        .current_dir(&dir)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo build runs");
    assert!(
        build.status.success(),
        "airlock-core does not build from its own package (in {}):\n{}",
        dir.display(),
        String::from_utf8_lossy(&build.stderr)
    );
}

fn core_version() -> String {
    let manifest = std::fs::read_to_string(root().join("core/Cargo.toml")).expect("core/Cargo.toml");
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("core/Cargo.toml has a version")
        .to_string()
}
