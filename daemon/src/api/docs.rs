//! The book at `/docs`: the files mdBook built from `docs/`, read from `api.docs_dir` (or
//! `book/` above `rlvrd`'s own directory), so that a team reads the docs of the version its
//! daemon runs.
//!
//! Open like `/ui` and `/healthz`: the book holds nothing a token guards. The files are served by
//! tower-http's `ServeDir`, which refuses paths that leave the directory (`..`, absolute parts)
//! and answers conditional and range requests; it is told not to list or redirect directories, so
//! every answer is a file of the book, its first page, or 404. mdBook's pages carry inline scripts
//! and styles (the theme and the search set themselves up inline), so the book's
//! Content-Security-Policy allows those, unlike the web page's: the files are the operator's
//! build, never a tenant's text. `no-cache` makes a browser revalidate (by `Last-Modified`) on
//! each load, so an upgraded daemon's book is never mixed with an older one's pages.

use std::path::{Path, PathBuf};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use tower::ServiceExt;
use tower_http::services::ServeDir;

/// The book's first page, in the directory mdBook builds.
pub const INDEX: &str = "index.html";

/// What the book's pages may load and reach: their own files, inline scripts and styles included.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self' 'unsafe-inline'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; connect-src 'self'; \
     form-action 'none'; base-uri 'none'; frame-ancestors 'none'";

/// Why `api.docs_dir` cannot be served.
#[derive(Debug, thiserror::Error)]
#[error(
    "api.docs_dir {}: no {INDEX} there (build the book: mdbook build docs --dest-dir DIR, or scripts/test.sh builds target/book)",
    .0.display()
)]
pub struct NoBook(pub PathBuf);

/// The directory `/docs` serves: `api.docs_dir`, which must hold the book's first page; else
/// `book/` in the directory above `exe`'s (`target/book` for `target/release/rlvrd`) when it holds
/// one; else none.
pub fn book_dir(configured: Option<&Path>, exe: &Path) -> Result<Option<PathBuf>, NoBook> {
    let has_index = |dir: &Path| dir.join(INDEX).is_file();
    match configured {
        Some(dir) if has_index(dir) => Ok(Some(dir.to_owned())),
        Some(dir) => Err(NoBook(dir.to_owned())),
        None => Ok(exe
            .parent()
            .and_then(Path::parent)
            .map(|above| above.join("book"))
            .filter(|dir| has_index(dir))),
    }
}

/// `/docs` (redirected to `/docs/`, so the pages' relative links resolve under it), `/docs/` and
/// the book's files; every path under `/docs` answers 404 with the reason when `book` is `None`.
pub fn routes(book: Option<PathBuf>) -> Router {
    let pages = match book {
        Some(dir) => {
            let files = ServeDir::new(dir).append_index_html_on_directories(false);
            Router::new().route("/docs/", get(page)).route("/docs/{*path}", get(page)).with_state(files)
        }
        None => Router::new().route("/docs/", get(no_book)).route("/docs/{*path}", get(no_book)),
    };
    // Relative, so that a proxy mounting the daemon under a prefix keeps it.
    pages.route("/docs", get(|| async { Redirect::permanent("docs/") }))
}

async fn no_book() -> Response {
    let why = "this daemon serves no book: build it (mdbook build docs) and set api.docs_dir\n";
    (StatusCode::NOT_FOUND, secure_headers(), why).into_response()
}

/// The file of the book at the request's path under `/docs`; its first page for `/docs/`.
async fn page(State(files): State<ServeDir>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let within = match parts.uri.path().strip_prefix("/docs").unwrap_or("/") {
        "/" => "/index.html",
        path => path,
    };
    // The query is dropped: a static file answers the same to any.
    parts.uri = match Uri::builder().path_and_query(within).build() {
        Ok(uri) => uri,
        Err(_) => return not_found(),
    };
    let answer = match files.oneshot(Request::from_parts(parts, body)).await {
        Ok(answer) => answer,
        Err(never) => match never {},
    };
    if answer.status() == StatusCode::NOT_FOUND {
        return not_found();
    }
    let mut answer = answer.map(Body::new);
    let headers = answer.headers_mut();
    for (name, value) in secure_headers() {
        headers.insert(name, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    answer
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, secure_headers(), "no such page of the book\n").into_response()
}

/// The headers every answer under `/docs` carries.
fn secure_headers() -> [(header::HeaderName, HeaderValue); 3] {
    super::ui::static_file_headers(CONTENT_SECURITY_POLICY)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A book of two pages, a style sheet and a chapter directory, and a file beside the book that
    /// no path may reach.
    fn book() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("book");
        std::fs::create_dir_all(dir.join("teams")).unwrap();
        std::fs::write(dir.join(INDEX), "<h1>rlvr</h1>").unwrap();
        std::fs::write(dir.join("teams/cli.html"), "<h1>The CLI</h1>").unwrap();
        std::fs::write(dir.join("book.css"), "body{}").unwrap();
        std::fs::write(root.path().join("secret.toml"), "token = 1").unwrap();
        root
    }

    /// Status, content type, location, CSP and body of `GET path`.
    fn get(router: Router, path: &str) -> (u16, Option<String>, Option<String>, Option<String>, String) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let request = Request::get(path).body(Body::empty()).unwrap();
            let response = router.oneshot(request).await.unwrap();
            let header = |name: header::HeaderName| {
                response.headers().get(name).map(|value| value.to_str().unwrap().to_owned())
            };
            let seen = (
                header(header::CONTENT_TYPE),
                header(header::LOCATION),
                header(header::CONTENT_SECURITY_POLICY),
            );
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            (status, seen.0, seen.1, seen.2, String::from_utf8_lossy(&body).into_owned())
        })
    }

    #[test]
    fn each_path_gets_its_file_of_the_book_or_404_and_none_leaves_it() {
        let root = book();
        let routes = || routes(Some(root.path().join("book")));
        let csp = Some(CONTENT_SECURITY_POLICY.to_owned());
        const TEXT: Option<&str> = Some("text/plain; charset=utf-8");
        const NO_PAGE: &str = "no such page of the book\n";
        let cases: &[(&str, u16, Option<&str>, &str)] = &[
            ("/docs/", 200, Some("text/html"), "<h1>rlvr</h1>"),
            ("/docs/index.html", 200, Some("text/html"), "<h1>rlvr</h1>"),
            ("/docs/teams/cli.html", 200, Some("text/html"), "<h1>The CLI</h1>"),
            ("/docs/teams/cli.html?highlight=grpo", 200, Some("text/html"), "<h1>The CLI</h1>"),
            ("/docs/book.css", 200, Some("text/css"), "body{}"),
            ("/docs/missing.html", 404, TEXT, NO_PAGE),
            // A directory is neither listed nor redirected.
            ("/docs/teams", 404, TEXT, NO_PAGE),
            ("/docs/teams/", 404, TEXT, NO_PAGE),
            ("/docs/../secret.toml", 404, TEXT, NO_PAGE),
            ("/docs/%2e%2e/secret.toml", 404, TEXT, NO_PAGE),
            ("/docs//etc/passwd", 404, TEXT, NO_PAGE),
        ];
        for (path, status, content_type, body) in cases {
            let (got, kind, _, policy, text) = get(routes(), path);
            assert_eq!((got, kind.as_deref(), text.as_str()), (*status, *content_type, *body), "{path}");
            assert_eq!(policy, csp, "{path}");
        }
        let (status, _, location, _, _) = get(routes(), "/docs");
        assert_eq!((status, location.as_deref()), (308, Some("docs/")));
    }

    #[test]
    fn without_a_book_every_path_under_docs_says_why() {
        for path in ["/docs/", "/docs/index.html", "/docs/teams/cli.html"] {
            let (status, _, _, policy, text) = get(routes(None), path);
            assert_eq!(status, 404, "{path}");
            assert!(text.contains("set api.docs_dir"), "{path}: {text}");
            assert_eq!(policy.as_deref(), Some(CONTENT_SECURITY_POLICY), "{path}");
        }
    }

    #[test]
    fn the_book_is_the_configured_directory_or_the_one_above_the_executable() {
        let root = book();
        let built = root.path().join("book");
        let exe = root.path().join("release/rlvrd");
        let elsewhere = root.path().join("bin/deep/rlvrd");
        assert_eq!(book_dir(Some(&built), &elsewhere).unwrap(), Some(built.clone()));
        assert_eq!(book_dir(None, &exe).unwrap(), Some(built.clone()));
        assert_eq!(book_dir(None, &elsewhere).unwrap(), None);
        let empty = root.path().join("release");
        let refused = book_dir(Some(&empty), &exe).unwrap_err().to_string();
        assert!(
            refused.starts_with(&format!("api.docs_dir {}: no index.html", empty.display())),
            "{refused}"
        );
    }
}
