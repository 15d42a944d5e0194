//! URLs fit for an error message, a log line or `Debug` output.

/// `url` without what may be a secret: the password (`user:***@`), a user name alone, which is
/// often a token or a password put there (`***@`), and the query and fragment, which may carry
/// one (`?password=`): `?…`. Where the URL is ambiguous (an `@` after the host, as an
/// unencoded `/`, `?` or `#` in a password makes it), more is hidden, never less. A URL
/// without `//` that holds an `@` (a typo such as `postgres:u:secret@h/db`) keeps only its
/// scheme, as does one with a query or an `=` (`postgres:?host=db&password=…`, which sqlx
/// takes); text without a scheme at all (`token@host:4222`, which some clients take, or
/// `host=db password=…`) is hidden whole when it holds an `@` or an `=`.
///
/// ```
/// use idempotency_core::redact_url;
///
/// assert_eq!(redact_url("redis://:secret@cache:6379/0"), "redis://:***@cache:6379/0");
/// assert_eq!(redact_url("amqp://guest:secret@mq:5672/%2f"), "amqp://guest:***@mq:5672/%2f");
/// assert_eq!(redact_url("nats://s3cr3t-token@nats:4222"), "nats://***@nats:4222");
/// assert_eq!(redact_url("postgres://db/app?password=x"), "postgres://db/app?…");
/// assert_eq!(redact_url("redis-cluster://a:7000,b:7001"), "redis-cluster://a:7000,b:7001");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url
        .split_once("://")
        .filter(|(scheme, _)| is_scheme(scheme))
    else {
        return match url.split_once(':') {
            Some((scheme, _)) if is_scheme(scheme) && url.contains(['@', '?', '=']) => {
                format!("{scheme}:…")
            }
            Some((scheme, _)) if is_scheme(scheme) => url.to_owned(),
            _ if url.contains(['@', '=']) => "…".to_owned(),
            _ => url.to_owned(),
        };
    };
    let (user, hosts) = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = match userinfo.split_once(':') {
                Some((user, _)) if !user.contains(['/', '?', '#']) => format!("{user}:***@"),
                _ => "***@".to_owned(),
            };
            (user, &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    let hosts = match hosts.find(['?', '#']) {
        Some(query) => format!("{}?…", &hosts[..query]),
        None => hosts.to_owned(),
    };
    format!("{scheme}://{user}{hosts}")
}

/// Whether `text` is a URL scheme: a letter, then letters, digits, `+`, `-` or `.` (RFC 3986).
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_user_names_alone_and_queries_are_hidden() {
        for (url, shown) in [
            ("postgres://u:p@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db", "postgres://***@h/db"),
            ("postgres://h:5432/db", "postgres://h:5432/db"),
            (
                "postgres://u:p@h/db?password=x&sslmode=require",
                "postgres://u:***@h/db?…",
            ),
            ("postgres://h/db?password=x", "postgres://h/db?…"),
            ("postgres://h/db#secret", "postgres://h/db?…"),
            ("mysql://u:p@h/db?opt=a@b", "mysql://u:***@b"),
            ("postgres://u:p?w@h/db", "postgres://u:***@h/db"),
            ("postgres://u:p/w@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db?x=a@b", "postgres://***@b"),
            ("postgres://u/x:y@h/db", "postgres://***@h/db"),
            ("sqlite:app.db", "sqlite:app.db"),
            ("sqlite::memory:", "sqlite::memory:"),
            ("postgres:u:secret@h/db", "postgres:…"),
            ("postgres:/u:secret@h/db", "postgres:…"),
            (
                "postgres://u:p@[::1]:5432/db",
                "postgres://u:***@[::1]:5432/db",
            ),
            (
                "redis-cluster://u:secret@a:1,b:2",
                "redis-cluster://u:***@a:1,b:2",
            ),
            ("redis://:secret@a:1/0", "redis://:***@a:1/0"),
            ("redis://secret@a:1", "redis://***@a:1"),
            ("redis-cluster://a:1,b:2", "redis-cluster://a:1,b:2"),
            ("redis://a:1/x@y", "redis://a:***@y"),
            ("nats://token@n:4222", "nats://***@n:4222"),
            ("s3cret@nats:4222", "…"),
            ("postgres:?host=db&password=s3cret", "postgres:…"),
            ("db.internal:5432/app?password=s3cret", "db.internal:…"),
            ("rediss:cache:6379?password=s3cret", "rediss:…"),
            ("s3cret@nats", "…"),
            ("tok@a:4222,nats://b:4222", "…"),
            ("host=db user=u password=s3cret", "…"),
            ("nats:4222", "nats:4222"),
            ("127.0.0.1:9092", "127.0.0.1:9092"),
            (
                "redis+unix:///tmp/r.sock?db=0",
                "redis+unix:///tmp/r.sock?…",
            ),
            ("", ""),
            ("@", "…"),
            ("x://@", "x://***@"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
