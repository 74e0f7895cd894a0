//! The options that name things outside the plugin: a URL, and a secret by name.
//!
//! A credential never comes from the environment: a key that once named an environment variable
//! is refused without looking at the environment, so the message is the same whether the
//! variable exists or not, and no answer tells a tenant which variables the daemon has.

use reqwest::Url;
use reqwest::header::HeaderValue;
use rlvr_plugin_api::{HostContext, OptionError};

/// Refuses `env_key` when the options object has it, pointing at `secret_key` instead. Call it
/// before the options are parsed, so this refusal wins over "unknown key".
pub fn refuse_env_key(config_json: &str, env_key: &str, secret_key: &str) -> Result<(), OptionError> {
    let value = serde_json::from_str::<serde_json::Value>(config_json).ok();
    if value.is_some_and(|value| value.get(env_key).is_some()) {
        return Err(OptionError::new(
            env_key,
            format!(
                "environment variable names are not accepted; ask the daemon's operator for the name of a \
                 secret your team may use and set {secret_key} to it"
            ),
        ));
    }
    Ok(())
}

/// Checks a secret's name as written at `key`: not blank.
pub fn check_secret_name(key: &str, name: Option<&str>) -> Result<(), OptionError> {
    if name.is_some_and(|name| name.trim().is_empty()) {
        return Err(OptionError::new(key, "expected the name of a secret, got an empty string"));
    }
    Ok(())
}

/// `Authorization: Bearer <the secret named name>` from `host`, marked sensitive. A missing secret
/// reads the same whether it does not exist or the job's team may not use it, and no message
/// shows a value.
pub fn bearer_header(key: &str, name: &str, host: &HostContext) -> Result<HeaderValue, OptionError> {
    let refuse = |message: String| OptionError::new(key, message);
    let secret = host
        .secret(name)
        .ok_or_else(|| refuse(format!("no secret named {name:?} is available to this job")))?;
    let token = secret.expose().trim();
    if token.is_empty() {
        return Err(refuse(format!("the secret {name:?} is empty")));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| refuse(format!("the secret {name:?} is not valid in a header (visible ASCII only)")))?;
    value.set_sensitive(true);
    Ok(value)
}

/// Checks an `http://` or `https://` URL at `key`; `what` says whose it is ("the service's").
/// Credentials in a URL end up in logs and process listings, so they are refused and the message
/// does not repeat them.
pub fn check_url(key: &str, url: Option<&str>, what: &str) -> Result<Url, OptionError> {
    let refuse = |message: String| OptionError::new(key, message);
    let Some(text) = url else {
        return Err(refuse(format!("missing (expected {what} http:// or https:// URL)")));
    };
    let url = Url::parse(text)
        .map_err(|error| refuse(format!("expected an http:// or https:// URL, got {text:?} ({error})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refuse(format!("expected an http:// or https:// URL, got scheme {:?}", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse(format!("expected a host in {text:?}")));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse("expected no user:password in the URL, use a secret instead".to_owned()));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use rlvr_plugin_api::Secret;

    use super::*;

    #[test]
    fn bearer_headers_from_the_host_only() {
        let mut host = HostContext::default();
        host.secrets.insert("t".into(), Secret::new(" s3cret\n"));
        host.secrets.insert("blank".into(), Secret::new(" "));
        host.secrets.insert("bad".into(), Secret::new("s3cret\nvalue"));
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("t", Ok("Bearer s3cret")),
            ("other", Err("k: no secret named \"other\" is available to this job")),
            ("blank", Err("k: the secret \"blank\" is empty")),
            ("bad", Err("k: the secret \"bad\" is not valid in a header (visible ASCII only)")),
        ];
        for (name, expected) in cases {
            let got = bearer_header("k", name, &host);
            match (&got, expected) {
                (Ok(value), Ok(want)) => {
                    assert_eq!(value.to_str().unwrap(), *want);
                    assert!(value.is_sensitive());
                }
                (Err(error), Err(want)) => assert_eq!(error.to_string(), *want),
                _ => panic!("{name}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn urls() {
        let cases: &[(Option<&str>, Result<&str, &str>)] = &[
            (Some("http://127.0.0.1:8000/v1"), Ok("http://127.0.0.1:8000/v1")),
            (None, Err("url: missing (expected the peer's http:// or https:// URL)")),
            (Some("ftp://h/"), Err("url: expected an http:// or https:// URL, got scheme \"ftp\"")),
            (Some("http://u:p@h/"), Err("url: expected no user:password in the URL, use a secret instead")),
        ];
        for (url, expected) in cases {
            let got = check_url("url", *url, "the peer's").map(|u| u.to_string()).map_err(|e| e.to_string());
            assert_eq!(got, expected.map(str::to_owned).map_err(str::to_owned), "{url:?}");
        }
    }

    #[test]
    fn env_keys_are_refused_before_anything_else() {
        assert_eq!(
            refuse_env_key(r#"{"x_env": "HOME", "bogus": 1}"#, "x_env", "x_secret").unwrap_err().to_string(),
            "x_env: environment variable names are not accepted; ask the daemon's operator for the name of a \
             secret your team may use and set x_secret to it"
        );
        refuse_env_key(r#"{"x_secret": "a"}"#, "x_env", "x_secret").unwrap();
        refuse_env_key("not json", "x_env", "x_secret").unwrap();
    }
}
