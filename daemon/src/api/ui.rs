//! The web page at `/ui`: plain files (`daemon/ui/`), built into the binary, so `rlvrd serve`
//! serves them with nothing to install or read at run time.
//!
//! The page is static and open (no token): it asks for the team's token itself and calls the API
//! with it, whose own check decides what the token sees. It is served with a strict
//! Content-Security-Policy — its own script and style only, no inline script, requests to this
//! origin only, no framing — so a tenant-written string that slipped into the page as markup could
//! still run nothing; the script itself never builds markup from data.
//!
//! The files are built in with `include_bytes!` and served with `nosniff` and ETags. The script
//! writes every tenant string as text, and reads the event stream with `fetch`, since
//! `EventSource` cannot send the token.

use axum::Router;
use axum::http::StatusCode;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

/// One file of the page.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    bytes: include_bytes!("../../ui/index.html"),
};

const ASSETS: [Asset; 3] = [
    INDEX,
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../ui/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../ui/app.css"),
    },
];

/// What the page may load and reach: its own files, and the API on the same origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'";

/// The page's routes: `/ui` (redirected to `/ui/`, so the page's relative links resolve under it),
/// `/ui/` and its files.
pub fn routes() -> Router {
    Router::new()
        // Relative, so that a proxy mounting the daemon under a prefix keeps it.
        .route("/ui", get(|| async { Redirect::permanent("ui/") }))
        .route("/ui/", get(|headers: HeaderMap| async move { serve(&INDEX, &headers) }))
        .route("/ui/{file}", get(file))
}

async fn file(axum::extract::Path(name): axum::extract::Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|asset| asset.name == name) {
        Some(asset) => serve(asset, &headers),
        None => (StatusCode::NOT_FOUND, secure_headers(), "no such file of the page\n").into_response(),
    }
}

/// The headers every answer under `/ui` carries.
fn secure_headers() -> [(header::HeaderName, HeaderValue); 3] {
    static_file_headers(CONTENT_SECURITY_POLICY)
}

/// The headers of an open static file's answer (the page's and the book's, `super::docs`): its
/// `policy`, no sniffing of its type, no referrer sent on.
pub(super) fn static_file_headers(policy: &'static str) -> [(header::HeaderName, HeaderValue); 3] {
    [
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(policy)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ]
}

/// The asset, or 304 when the browser's copy (`If-None-Match`) is this binary's. Cached but
/// revalidated on every load (`no-cache`): an upgraded daemon's page is never mixed with an older
/// one's script.
fn serve(asset: &Asset, headers: &HeaderMap) -> Response {
    let etag = format!("\"{}\"", &hex::encode(Sha256::digest(asset.bytes))[..32]);
    let cache = [
        (header::ETAG, HeaderValue::from_str(&etag).expect("hex is a header value")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|tag| tag.trim() == etag || tag.trim() == "*"));
    if fresh {
        return (StatusCode::NOT_MODIFIED, secure_headers(), cache).into_response();
    }
    let content_type = [(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type))];
    (secure_headers(), cache, content_type, asset.bytes).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    /// What the router answers to `GET path` with `headers`: status, the headers that matter here
    /// (content type, location, CSP, nosniff, cache control) and the body's length.
    fn get(path: &str, headers: &[(&str, &str)]) -> (u16, [Option<String>; 5], usize) {
        let mut request = Request::get(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let response = routes().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
            let header = |name: header::HeaderName| {
                response.headers().get(name).map(|value| value.to_str().unwrap().to_owned())
            };
            let seen = [
                header(header::CONTENT_TYPE),
                header(header::LOCATION),
                header(header::CONTENT_SECURITY_POLICY),
                header(header::X_CONTENT_TYPE_OPTIONS),
                header(header::CACHE_CONTROL),
            ];
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            (status, seen, body.len())
        })
    }

    #[test]
    fn each_path_gets_its_file_with_its_type_and_the_locked_down_headers() {
        let csp = Some(CONTENT_SECURITY_POLICY.to_owned());
        let nosniff = Some("nosniff".to_owned());
        let check = |path: &str, status: u16, content_type: Option<&str>, length: usize| {
            let (got, [kind, _, policy, sniff, _], body) = get(path, &[]);
            assert_eq!((got, kind.as_deref(), body), (status, content_type, length), "{path}");
            assert_eq!((&policy, &sniff), (&csp, &nosniff), "{path}");
        };
        check("/ui/", 200, Some("text/html; charset=utf-8"), INDEX.bytes.len());
        check("/ui/index.html", 200, Some("text/html; charset=utf-8"), INDEX.bytes.len());
        check("/ui/app.js", 200, Some("text/javascript; charset=utf-8"), ASSETS[1].bytes.len());
        check("/ui/app.css", 200, Some("text/css; charset=utf-8"), ASSETS[2].bytes.len());
        check("/ui/%2e%2e%2fCargo.toml", 404, Some("text/plain; charset=utf-8"), 25);
        check("/ui/app.js.map", 404, Some("text/plain; charset=utf-8"), 25);
    }

    #[test]
    fn the_bare_path_redirects_under_itself_so_relative_links_resolve() {
        let (status, [_, location, ..], _) = get("/ui", &[]);
        assert_eq!((status, location.as_deref()), (308, Some("ui/")));
    }

    #[test]
    fn a_browser_with_this_binarys_copy_gets_304_and_any_other_copy_the_file() {
        let etag = format!("\"{}\"", &hex::encode(Sha256::digest(ASSETS[1].bytes))[..32]);
        let (status, [.., cache], length) = get("/ui/app.js", &[("if-none-match", &etag)]);
        assert_eq!((status, cache.as_deref(), length), (304, Some("no-cache"), 0));
        let (status, _, length) = get("/ui/app.js", &[("if-none-match", "\"an older build\"")]);
        assert_eq!((status, length), (200, ASSETS[1].bytes.len()));
    }

    // The page's module and stylesheet are named in index.html relative to it, and each must be
    // one the router serves.
    #[test]
    fn every_file_the_page_names_is_served() {
        let index = std::str::from_utf8(INDEX.bytes).unwrap();
        for name in ["app.js", "app.css"] {
            assert!(index.contains(&format!("\"{name}\"")), "index.html does not name {name}");
            assert!(ASSETS.iter().any(|asset| asset.name == name), "{name} is not served");
        }
    }

    // regression guard: the CSP forbids inline script and style, so the page must have none.
    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let index = std::str::from_utf8(INDEX.bytes).unwrap();
        assert!(!index.contains("<script>"), "inline script");
        assert!(!index.contains("<style"), "inline style");
        assert!(!index.contains(" style="), "style attribute");
        let handler = index.split(" on").skip(1).find(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert_eq!(handler, None, "inline event handler");
    }

    // The script puts data on the page as text: no innerHTML, outerHTML, insertAdjacentHTML or
    // document.write anywhere in it.
    #[test]
    fn the_script_never_parses_data_as_markup() {
        let script = std::str::from_utf8(ASSETS[1].bytes).unwrap();
        for sink in
            ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"]
        {
            assert!(!script.contains(sink), "app.js uses {sink}");
        }
    }
}
