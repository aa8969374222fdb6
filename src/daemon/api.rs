//! The HTTP API (axum). Reads are open (the daemon binds to loopback unless told otherwise);
//! every request that changes something needs `Authorization: Bearer <token>`, compared in
//! constant time, else 401. Bodies are limited (`daemon.max_body_bytes`, else 413) and every
//! error, including unknown paths and methods, is JSON: `{"error": "…"}`.
//!
//! | method | path | |
//! |---|---|---|
//! | GET | `/` | the status page (HTML, refreshes itself) |
//! | GET | `/healthz` | `{"ok": true}` |
//! | GET | `/v1/status` | phase, current study and trial, best so far, queue, time left |
//! | GET | `/v1/studies` | every study |
//! | POST | `/v1/studies` | enqueue a study (body: the study file's TOML) → 201 |
//! | GET | `/v1/studies/{id}` | one study |
//! | GET | `/v1/studies/{id}/trials` | its trials |
//! | GET | `/v1/studies/{id}/report?format=md\|json` | its report |
//! | POST | `/v1/studies/{id}/cancel\|pause\|resume` | control |
//! | GET | `/v1/best?model=…` | the recommended command line for this node |
//! | GET | `/metrics` | Prometheus text |

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::{page, views, Backend, Daemon, DaemonError};
use crate::api::{BestAnswerV1, JobV1, StatusV1, StudyDetailV1};
use crate::tune::spec::Study;

/// An error answer: a status and a JSON body naming what is wrong.
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"servetune\""),
            );
        }
        r
    }
}

impl From<DaemonError> for ApiError {
    fn from(e: DaemonError) -> ApiError {
        let code = match &e {
            DaemonError::NotFound(_) => StatusCode::NOT_FOUND,
            DaemonError::Conflict(_) => StatusCode::CONFLICT,
            DaemonError::BadRequest(_) | DaemonError::Tune(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;
type St<B> = State<Arc<Daemon<B>>>;

pub fn router<B: Backend>(d: Arc<Daemon<B>>) -> Router {
    let limit = d.cfg.max_body_bytes;
    Router::new()
        .route("/", get(index::<B>))
        .route("/healthz", get(healthz))
        .route("/v1/status", get(status::<B>))
        .route("/v1/studies", get(studies::<B>).post(submit::<B>))
        .route("/v1/studies/{id}", get(study::<B>))
        .route("/v1/studies/{id}/trials", get(trials::<B>))
        .route("/v1/studies/{id}/report", get(report::<B>))
        .route("/v1/studies/{id}/{action}", post(control::<B>))
        .route("/v1/best", get(best::<B>))
        .route("/metrics", get(metrics::<B>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(d)
}

async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such endpoint".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint".into(),
    )
}

/// 401 unless the request carries the bearer token.
fn authorize<B: Backend>(d: &Daemon<B>, headers: &HeaderMap) -> ApiResult<()> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(t) if d.authorized(t) => Ok(()),
        Some(_) => Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "the bearer token is wrong".into(),
        )),
        None => Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "this request changes something: it needs `Authorization: Bearer <token>` (the daemon's token file)".into(),
        )),
    }
}

async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "ok": true }))
}

async fn status<B: Backend>(State(d): St<B>) -> ApiResult<Json<StatusV1>> {
    Ok(Json(views::status(&d)?))
}

/// The catalog's JSON as it is: serialised once per store generation, not per request.
async fn studies<B: Backend>(State(d): St<B>) -> ApiResult<Response> {
    let c = d.catalog()?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        c.studies_json.clone(),
    )
        .into_response())
}

async fn study<B: Backend>(
    State(d): St<B>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<StudyDetailV1>> {
    let Path(id) = id.map_err(path_error)?;
    Ok(Json(views::study_detail(&d, &id)?))
}

async fn trials<B: Backend>(
    State(d): St<B>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Vec<crate::api::TrialV1>>> {
    let Path(id) = id.map_err(path_error)?;
    Ok(Json(views::trials(&d, &id)?))
}

#[derive(Deserialize)]
struct ReportQuery {
    format: Option<String>,
}

async fn report<B: Backend>(
    State(d): St<B>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<ReportQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let Path(id) = id.map_err(path_error)?;
    let Query(q) = q.map_err(query_error)?;
    use crate::report::{self, ReportError};
    let data = report::build(&d.store, &id).map_err(|e| match e {
        ReportError::NoStudy(_) => ApiError(StatusCode::NOT_FOUND, e.to_string()),
        ReportError::Empty(_) => ApiError(StatusCode::CONFLICT, e.to_string()),
        _ => ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    })?;
    match q.format.as_deref().unwrap_or("md") {
        "md" | "markdown" => Ok((
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            report::markdown(&data, &[]),
        )
            .into_response()),
        "json" => Ok(Json(report::json(&data)).into_response()),
        other => Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("format: {other:?} is not md or json"),
        )),
    }
}

#[derive(Deserialize)]
struct BestQuery {
    model: Option<String>,
}

async fn best<B: Backend>(
    State(d): St<B>,
    q: Result<Query<BestQuery>, QueryRejection>,
) -> ApiResult<Json<BestAnswerV1>> {
    let Query(q) = q.map_err(query_error)?;
    Ok(Json(views::best(&d, q.model.as_deref())?))
}

async fn metrics<B: Backend>(State(d): St<B>) -> ApiResult<Response> {
    Ok((
        [(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)],
        super::metrics::render(&d)?,
    )
        .into_response())
}

async fn index<B: Backend>(State(d): St<B>) -> ApiResult<Html<String>> {
    Ok(Html(page::render(&d)?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitJson {
    /// The study file's text (TOML).
    study: String,
    #[serde(default = "yes")]
    warm: bool,
}

fn yes() -> bool {
    true
}

/// A path or query axum could not parse, as a JSON error.
fn path_error(e: PathRejection) -> ApiError {
    ApiError(e.status(), format!("path: {}", e.body_text()))
}

fn query_error(e: QueryRejection) -> ApiError {
    ApiError(e.status(), format!("query: {}", e.body_text()))
}

/// `POST /v1/studies`: the body is a study file (TOML), or JSON `{"study": "<TOML>", "warm":
/// true}`; it is checked like `servetune tune` checks it before it is queued.
async fn submit<B: Backend>(
    State(d): St<B>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<(StatusCode, Json<JobV1>)> {
    // The token first: an anonymous client never makes the daemon buffer a body.
    authorize(&d, &headers)?;
    let body = axum::body::to_bytes(body, d.cfg.max_body_bytes)
        .await
        .map_err(|e| {
            ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request body: larger than {} bytes, or unreadable ({e})",
                    d.cfg.max_body_bytes
                ),
            )
        })?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError(StatusCode::BAD_REQUEST, "the body is not UTF-8".into()))?;
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let (text, warm) = if json {
        let s: SubmitJson = serde_json::from_str(text)
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("request body: {e}")))?;
        (s.study, s.warm)
    } else {
        (text.to_owned(), true)
    };
    // Relative paths in a submitted study are relative to the daemon's config file.
    let spec_path: PathBuf = d
        .cfg
        .path
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("submitted.toml");
    let study = Study::parse_in(&text, &spec_path, d.cfg.search_spaces.as_deref())
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    if d.stopping() {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the daemon is stopping".into(),
        ));
    }
    let job = d.submit(&study, spec_path, "submitted", warm)?;
    Ok((StatusCode::CREATED, Json(JobV1::from(job))))
}

async fn control<B: Backend>(
    State(d): St<B>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> ApiResult<Json<JobV1>> {
    authorize(&d, &headers)?;
    let Path((id, action)) = path.map_err(path_error)?;
    let job = match action.as_str() {
        "cancel" => d.cancel(&id)?,
        "pause" => d.pause(&id)?,
        "resume" => d.resume(&id)?,
        other => {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no action {other:?} (cancel, pause or resume)"),
            ))
        }
    };
    Ok(Json(JobV1::from(job)))
}
