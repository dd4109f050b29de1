//! Unit tests of the settings' layers and scopes (defaults < file < environment, the
//! fallback's variables), and of the Service Bus plan.

use super::*;
use crate::config::vars as v;

fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn rabbit(b: &BackendSettings) -> &RabbitMqSettings {
    match b {
        BackendSettings::RabbitMq(r) => r,
        other => panic!("not rabbitmq: {other:?}"),
    }
}

#[test]
fn defaults_match_the_contract() {
    let s = Settings::from_vars(&HashMap::new()).unwrap();
    assert_eq!(s.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(
        s.primary,
        BackendSettings::Embedded {
            data_dir: PathBuf::from("./sendgate-data")
        }
    );
    assert_eq!(s.fallback, None);
    assert_eq!(s.queues, vec![QueueName::parse("requests").unwrap()]);
    assert_eq!(s.capacity.max_queue_depth, 2000);
    assert!(!s.capacity.fail_closed);
    assert_eq!(s.capacity.fail_closed_streak, 3);
    assert_eq!(s.capacity.depth_ttl, Duration::from_millis(1000));
    assert_eq!(s.capacity.admin_timeout, Duration::from_millis(2000));
    assert_eq!(s.capacity.retry_after_max, Duration::from_secs(300));
    assert_eq!(s.capacity.resume_below, Fraction::ONE);
    assert_eq!(s.send_timeout, Duration::from_millis(10000));
    assert_eq!(s.max_in_flight, 256);
    assert_eq!(s.max_body_bytes, 262_144);
    assert_eq!(s.drain_timeout, Duration::from_secs(30));
    assert_eq!(
        s.auth,
        AuthSettings::Open {
            explicitly_none: false
        }
    );
    let s = Settings::from_overrides(&[(&v::BACKEND, "rabbitmq")]).unwrap();
    let r = rabbit(&s.primary);
    assert_eq!(r.depth_source, DepthSource::Management);
    assert_eq!(r.uri.expose().authority.host, "127.0.0.1");
    assert_eq!(r.management_user, "guest");
    assert_eq!(r.management_password.expose(), "guest");
    assert_eq!(r.management_url.as_str(), "http://127.0.0.1:15672/");
}

#[test]
fn bad_values_name_the_variable() {
    let err = Settings::from_vars(&vars(&[("SENDGATE_DEPTH_TTL_MS", "soon")])).unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_DEPTH_TTL_MS:"),
        "{err}"
    );
    let err = Settings::from_vars(&vars(&[("SENDGATE_BACKEND", "kafka")])).unwrap_err();
    assert!(err.to_string().starts_with("SENDGATE_BACKEND:"), "{err}");
    let err = Settings::from_vars(&vars(&[("SENDGATE_MAX_IN_FLIGHT", "0")])).unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_MAX_IN_FLIGHT:"),
        "{err}"
    );
    let err = Settings::from_vars(&vars(&[("SENDGATE_QUEUES", "ok,bad name")])).unwrap_err();
    assert!(err.to_string().starts_with("SENDGATE_QUEUES:"), "{err}");
}

#[test]
fn durations_too_large_for_the_clock_are_refused() {
    for (var, value) in [
        ("SENDGATE_DRAIN_TIMEOUT_S", "9223372036854775808"),
        ("SENDGATE_BREAKER_OPEN_S", "86401"),
        ("SENDGATE_SEND_TIMEOUT_MS", "3600001"),
    ] {
        let err = Settings::from_vars(&vars(&[(var, value)])).unwrap_err();
        assert!(err.to_string().starts_with(var), "{err}");
    }
    assert!(Settings::from_vars(&vars(&[("SENDGATE_DRAIN_TIMEOUT_S", "86400")])).is_ok());
}

#[test]
fn non_loopback_without_keys_refuses_unless_auth_none() {
    let err = Settings::from_vars(&vars(&[("SENDGATE_LISTEN", "0.0.0.0:8080")])).unwrap_err();
    assert!(err.to_string().contains("non-loopback"), "{err}");
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_LISTEN", "0.0.0.0:8080"),
        ("SENDGATE_AUTH", "none"),
    ]))
    .unwrap();
    assert_eq!(
        s.auth,
        AuthSettings::Open {
            explicitly_none: true
        }
    );
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_LISTEN", "[::]:80"),
        ("SENDGATE_API_KEYS_FILE", "/k.toml"),
    ]))
    .unwrap();
    assert_eq!(
        s.auth,
        AuthSettings::Callers {
            keys_file: Some("/k.toml".into()),
            entra: None
        }
    );
    assert!(Settings::from_vars(&vars(&[("SENDGATE_LISTEN", "localhost:9000")])).is_ok());
    let err = Settings::from_overrides(&[(&v::AUTH, "none"), (&v::API_KEYS_FILE, "/k.toml")])
        .unwrap_err();
    assert!(err.to_string().starts_with("SENDGATE_AUTH:"), "{err}");
    let err = Settings::from_overrides(&[(&v::AUTH, "nope")]).unwrap_err();
    assert!(err.to_string().starts_with("SENDGATE_AUTH:"), "{err}");
}

/// `SENDGATE_ENTRA_ALLOWED_APPS` set but naming no application stops start-up: unset means
/// "every application of the tenant", so an empty value read as unset (as every other
/// variable's is) would open the gateway to all of them without a word, and read as "none"
/// would refuse every token. Neither is what someone who set it meant; they are told.
#[test]
fn allowed_apps_set_but_empty_is_refused_never_read_as_every_application() {
    const TENANT: &str = "11111111-2222-3333-4444-555555555555";
    let base = [
        ("SENDGATE_LISTEN", "0.0.0.0:8080"),
        ("SENDGATE_ENTRA_TENANT_ID", TENANT),
        ("SENDGATE_ENTRA_AUDIENCE", "api://sendgate"),
    ];
    // SENDGATE_CONFIG names the file whose text the file cases give.
    let mut with_file = base.to_vec();
    with_file.push(("SENDGATE_CONFIG", "sendgate.toml"));
    for empty in ["", "   ", ",", " , ,"] {
        let mut pairs = base.to_vec();
        pairs.push(("SENDGATE_ENTRA_ALLOWED_APPS", empty));
        let e = Settings::from_vars(&vars(&pairs)).unwrap_err();
        assert_eq!(
            e.variable(),
            Some("SENDGATE_ENTRA_ALLOWED_APPS"),
            "{empty:?}"
        );
        assert!(e.to_string().contains("names no application"), "{e}");
    }
    for file in ["entra_allowed_apps = \"\"\n", "entra_allowed_apps = []\n"] {
        let e = Settings::from_vars_and_file(&vars(&with_file), file).unwrap_err();
        assert_eq!(
            e.variable(),
            Some("SENDGATE_ENTRA_ALLOWED_APPS"),
            "{file:?}"
        );
    }
    // An empty value in the environment over a list in the file: the file's list (an
    // empty value is unset in its layer), which opens nothing.
    let mut pairs = with_file.clone();
    pairs.push(("SENDGATE_ENTRA_ALLOWED_APPS", ""));
    let s = Settings::from_vars_and_file(
        &vars(&pairs),
        "entra_allowed_apps = [\"aaaaaaaa-0000-0000-0000-000000000001\"]\n",
    )
    .unwrap();
    let AuthSettings::Callers {
        entra: Some(entra), ..
    } = s.auth
    else {
        panic!("{:?}", s.auth);
    };
    assert_eq!(entra.allowed_apps.map(|a| a.len()), Some(1));
    // Without the tenant, an empty value stays the harmless nothing it was.
    assert!(Settings::from_vars(&vars(&[("SENDGATE_ENTRA_ALLOWED_APPS", "")])).is_ok());
}

#[test]
fn file_layer_sits_between_defaults_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sendgate.toml");
    std::fs::write(
        &path,
        "queues = [\"a\", \"b\"]\ndepth_ttl_ms = 250\nservicebus_send_max_queue_depth = 7\nsend_timeout_ms = 500\n",
    )
    .unwrap();
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_CONFIG", path.to_str().unwrap()),
        ("SENDGATE_SEND_TIMEOUT_MS", "900"),
    ]))
    .unwrap();
    assert_eq!(s.queues.len(), 2);
    assert_eq!(s.capacity.depth_ttl, Duration::from_millis(250));
    assert_eq!(s.capacity.max_queue_depth, 7);
    assert_eq!(
        s.send_timeout,
        Duration::from_millis(900),
        "environment wins over the file"
    );
}

/// Unset, the stats lag is left to the backend to derive from the broker; set, it is kept
/// as given (the backend takes the longer of the two), and a fallback inherits it.
#[test]
fn the_stats_lag_is_only_what_is_set() {
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_RABBITMQ_URL", "amqp://a/%2f"),
        ("SENDGATE_FALLBACK_BACKEND", "rabbitmq"),
        ("SENDGATE_FALLBACK_RABBITMQ_URL", "amqp://b/%2f"),
    ]))
    .unwrap();
    assert_eq!(rabbit(&s.primary).stats_lag, None);
    assert_eq!(rabbit(s.fallback.as_ref().unwrap()).stats_lag, None);
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_RABBITMQ_URL", "amqp://a/%2f"),
        ("SENDGATE_RABBITMQ_STATS_LAG_MS", "20000"),
        ("SENDGATE_FALLBACK_BACKEND", "rabbitmq"),
        ("SENDGATE_FALLBACK_RABBITMQ_URL", "amqp://b/%2f"),
    ]))
    .unwrap();
    assert_eq!(rabbit(&s.primary).stats_lag, Some(Duration::from_secs(20)));
    assert_eq!(
        rabbit(s.fallback.as_ref().unwrap()).stats_lag,
        Some(Duration::from_secs(20)),
        "inherited"
    );
}

#[test]
fn a_fallback_reads_its_own_variables_then_the_primarys() {
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_RABBITMQ_URL", "amqp://a/%2f"),
        ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ("SENDGATE_FALLBACK_BACKEND", "rabbitmq"),
        ("SENDGATE_FALLBACK_RABBITMQ_URL", "amqp://b/%2f"),
    ]))
    .unwrap();
    let fb = rabbit(s.fallback.as_ref().unwrap());
    assert_eq!(fb.uri.expose().authority.host, "b");
    assert_eq!(rabbit(&s.primary).uri.expose().authority.host, "a");
    assert_eq!(fb.depth_source, DepthSource::Amqp, "inherited");
    let err = Settings::from_vars(&vars(&[("SENDGATE_FORCE_BACKEND", "fallback")])).unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_FORCE_BACKEND"),
        "{err}"
    );
    let err = Settings::from_vars(&vars(&[
        ("SENDGATE_FALLBACK_BACKEND", "rabbitmq"),
        ("SENDGATE_FALLBACK_RABBITMQ_DEPTH_SOURCE", "x"),
    ]))
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("SENDGATE_FALLBACK_RABBITMQ_DEPTH_SOURCE"),
        "{err}"
    );
    let err = Settings::from_vars(&vars(&[("SENDGATE_BREAKER_FAILURE_RATE", "1.5")])).unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_BREAKER_FAILURE_RATE"),
        "{err}"
    );
}

#[test]
fn only_the_chosen_backends_settings_are_carried() {
    let s = Settings::from_overrides(&[
        (&v::BACKEND, "servicebus"),
        (&v::SERVICEBUS_NAMESPACE, "ns"),
        (&v::FALLBACK_BACKEND, "embedded"),
        (&v::FALLBACK_DATA_DIR, "/fb"),
    ])
    .unwrap();
    match &s.primary {
        BackendSettings::ServiceBus(sb) => {
            assert_eq!(sb.endpoint, "https://ns.servicebus.windows.net");
            assert_eq!(sb.send, CredentialPlan::EntraId);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.fallback,
        Some(BackendSettings::Embedded {
            data_dir: "/fb".into()
        })
    );
    assert_eq!(s.embedded_data_dir(), Some(std::path::Path::new("/fb")));
    // A bad RabbitMQ URL is not read when no backend is RabbitMQ.
    assert!(Settings::from_overrides(&[(&v::RABBITMQ_URL, "nonsense")]).is_ok());
}

#[test]
fn a_bad_fallback_value_is_named_by_the_fallbacks_variable() {
    let err = Settings::from_overrides(&[
        (&v::FALLBACK_BACKEND, "rabbitmq"),
        (&v::FALLBACK_RABBITMQ_URL, "http://h/"),
    ])
    .unwrap_err();
    assert_eq!(
        err.variable(),
        Some("SENDGATE_FALLBACK_RABBITMQ_URL"),
        "{err}"
    );
    // Inherited from the primary's variable: that is the one named.
    let err = Settings::from_overrides(&[
        (&v::FALLBACK_BACKEND, "rabbitmq"),
        (&v::RABBITMQ_MANAGEMENT_URL, "not a url"),
    ])
    .unwrap_err();
    assert_eq!(
        err.variable(),
        Some("SENDGATE_RABBITMQ_MANAGEMENT_URL"),
        "{err}"
    );
    let err = Settings::from_overrides(&[
        (&v::FALLBACK_BACKEND, "servicebus"),
        (&v::FALLBACK_SERVICEBUS_ENDPOINT, "ftp://x"),
    ])
    .unwrap_err();
    assert_eq!(
        err.variable(),
        Some("SENDGATE_FALLBACK_SERVICEBUS_ENDPOINT"),
        "{err}"
    );
    let err = Settings::from_overrides(&[
        (&v::FALLBACK_BACKEND, "rabbitmq"),
        (&v::FALLBACK_RABBITMQ_STATS_LAG_MS, "3600001"),
    ])
    .unwrap_err();
    assert_eq!(
        err.variable(),
        Some("SENDGATE_FALLBACK_RABBITMQ_STATS_LAG_MS"),
        "{err}"
    );
}

#[test]
fn management_credentials_come_from_the_url_unless_set() {
    let s = Settings::from_overrides(&[
        (&v::BACKEND, "rabbitmq"),
        (&v::RABBITMQ_URL, "amqp://app:apppw@h:5672/prod"),
    ])
    .unwrap();
    let r = rabbit(&s.primary);
    assert_eq!(
        (
            r.management_user.as_str(),
            r.management_password.expose().as_str()
        ),
        ("app", "apppw")
    );
    assert_eq!(r.uri.expose().vhost, "prod");
    let s = Settings::from_overrides(&[
        (&v::BACKEND, "rabbitmq"),
        (&v::RABBITMQ_URL, "amqp://app:apppw@h:5672/prod"),
        (&v::RABBITMQ_MANAGEMENT_USER, "admin"),
        (&v::RABBITMQ_MANAGEMENT_PASSWORD, "adminpw"),
    ])
    .unwrap();
    let r = rabbit(&s.primary);
    assert_eq!(
        (
            r.management_user.as_str(),
            r.management_password.expose().as_str()
        ),
        ("admin", "adminpw")
    );
    assert!(
        !format!("{s:?}").contains("apppw"),
        "Debug hides the URL's password"
    );
    assert!(!format!("{s:?}").contains("adminpw"));
}

#[test]
fn an_amqp_url_that_does_not_parse_is_never_echoed() {
    for bad in [
        "amqp://user:s3cr3tpw@host:notaport/%2f",
        "amqp:user:s3cr3tpw",
        "http://user:s3cr3tpw@host/",
        "amqp://user:s3cr3tpw@host/%2f?frame_max=lots",
        "amqp://user:s3cr3tpw@host/%2f?auth_mechanism=s3cr3tpw",
        // lapin lower-cases the mechanism it quotes, and the URL keeps the password
        // percent-encoded: neither may let the password through.
        "amqp://user:S3CR3TPW@host/%2f?auth_mechanism=S3CR3TPW",
        "amqp://user:s3cr3t%70w@host/%2f?auth_mechanism=s3cr3tpw",
        "user:s3cr3tpw@host",
    ] {
        for url_var in [&v::RABBITMQ_URL, &v::FALLBACK_RABBITMQ_URL] {
            let err = Settings::from_overrides(&[
                (&v::BACKEND, "rabbitmq"),
                (&v::FALLBACK_BACKEND, "rabbitmq"),
                (url_var, bad),
            ])
            .unwrap_err();
            assert_eq!(err.variable(), Some(url_var.name), "{err}");
            let shown = format!("{err} {err:?}").to_lowercase();
            assert!(!shown.contains("s3cr3tpw"), "{shown}");
        }
    }
}

#[test]
fn a_secret_variable_is_never_echoed_in_a_parse_error() {
    let err = Settings::from_overrides(&[
        (&v::BACKEND, "servicebus"),
        (
            &v::SERVICEBUS_CONNECTION_STRING,
            "Endpoint=sb://ns.servicebus.windows.net/,SharedAccessKeyName=send,SharedAccessKey=KeyKeyKey123=",
        ),
    ])
    .unwrap_err();
    assert_eq!(err.variable(), Some("SERVICEBUS_CONNECTION_STRING"));
    assert!(!format!("{err} {err:?}").contains("KeyKeyKey123"), "{err}");
    assert!(err.to_string().contains("';', not ','"), "{err}");
}

#[test]
fn unknown_sendgate_variables_are_refused_with_a_suggestion() {
    let err = Settings::from_vars(&vars(&[("SENDGATE_DEPHT_TTL_MS", "5")])).unwrap_err();
    assert_eq!(
        err,
        ConfigError::UnknownVariable {
            name: "SENDGATE_DEPHT_TTL_MS".into(),
            suggestion: Some("SENDGATE_DEPTH_TTL_MS")
        }
    );
    assert!(
        err.to_string()
            .contains("did you mean SENDGATE_DEPTH_TTL_MS?"),
        "{err}"
    );
    let err = Settings::from_vars(&vars(&[("SENDGATE_COLOUR", "blue")])).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::UnknownVariable {
                suggestion: None,
                ..
            }
        ),
        "{err}"
    );
    // The client's variable and other tools' SERVICEBUS_* variables are tolerated.
    assert!(Settings::from_vars(&vars(&[
        ("SENDGATE_TOKEN", "sg_x"),
        ("SERVICEBUS_SOMETHING_ELSE", "1"),
    ]))
    .is_ok());
}

#[test]
fn unknown_file_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sendgate.toml");
    std::fs::write(&path, "depht_ttl_ms = 5\n").unwrap();
    let err =
        Settings::from_vars(&vars(&[("SENDGATE_CONFIG", path.to_str().unwrap())])).unwrap_err();
    assert_eq!(
        err,
        ConfigError::UnknownKey {
            key: "depht_ttl_ms".into(),
            suggestion: Some("depth_ttl_ms".into())
        }
    );
    assert!(
        err.to_string().contains("did you mean depth_ttl_ms?"),
        "{err}"
    );
}

#[test]
fn every_choice_variable_parses_each_of_its_options() {
    for var in VARIABLES.iter().filter(|v| v.side == vars::Side::Server) {
        let vars::Kind::Choice(options) = var.kind else {
            continue;
        };
        for option in options {
            let mut pairs = vec![(*var, *option)];
            // Options that need a partner to be valid on their own.
            if var.name == v::FORCE_BACKEND.name || var.name == v::AUTH.name {
                pairs.push((&v::FALLBACK_BACKEND, "embedded"));
            }
            if option == &"servicebus" {
                pairs.push((&v::SERVICEBUS_NAMESPACE, "ns"));
            }
            if option == &"redis" {
                pairs.push((&v::REDIS_URL, "redis://127.0.0.1:6379"));
            }
            if var.name == v::REDIS_AUTH.name {
                pairs.push((&v::COORDINATION, "redis"));
                pairs.push((
                    &v::REDIS_URL,
                    "rediss://00000000-0000-0000-0000-000000000000@host:10000",
                ));
            }
            let result = Settings::from_overrides(&pairs);
            assert!(result.is_ok(), "{}={option}: {result:?}", var.name);
        }
    }
}

#[test]
fn a_file_that_is_not_toml_is_refused_without_quoting_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        (
            "a.toml",
            "queues = [\"a\"]\nrabbitmq_url = amqp://u:s3cr3tpw@h\n",
        ),
        ("b.toml", "rabbitmq_url = \"amqp://u:s3cr3tpw@h\n"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let err =
            Settings::from_vars(&vars(&[("SENDGATE_CONFIG", path.to_str().unwrap())])).unwrap_err();
        let shown = err.to_string();
        assert!(shown.starts_with("SENDGATE_CONFIG: "), "{shown}");
        assert!(!shown.contains("s3cr3tpw"), "{shown}");
    }
    let path = dir.path().join("a.toml");
    let err =
        Settings::from_vars(&vars(&[("SENDGATE_CONFIG", path.to_str().unwrap())])).unwrap_err();
    assert!(err.to_string().contains("line 2, column 16"), "{err}");
    let err = Settings::from_vars(&vars(&[("SENDGATE_CONFIG", "/nonexistent/sendgate.toml")]))
        .unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_CONFIG: cannot read"),
        "{err}"
    );
}

#[test]
fn a_management_url_with_credentials_is_refused_without_echoing_them() {
    // A password in the admin plane's URL would be ignored (the request authenticates with
    // SENDGATE_RABBITMQ_MANAGEMENT_USER/_PASSWORD) yet printed by every failed depth read
    // (reqwest's errors name the URL) and by `Debug`: refuse it, and never show it.
    for bad in [
        "http://admin:s3cr3tpw@h:15672",
        "http://admin:s3cr3tpw@h:99999",
        "http://admin:s3cr3tpw@[::1",
        "ftp://admin:s3cr3tpw@h/",
    ] {
        for var in [
            &v::RABBITMQ_MANAGEMENT_URL,
            &v::FALLBACK_RABBITMQ_MANAGEMENT_URL,
        ] {
            let err = Settings::from_overrides(&[
                (&v::BACKEND, "rabbitmq"),
                (&v::FALLBACK_BACKEND, "rabbitmq"),
                (var, bad),
            ])
            .unwrap_err();
            assert_eq!(err.variable(), Some(var.name), "{err}");
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("s3cr3tpw"), "{shown}");
        }
    }
    // Without credentials the value is still shown, to help fix it.
    let err = Settings::from_overrides(&[
        (&v::BACKEND, "rabbitmq"),
        (&v::RABBITMQ_MANAGEMENT_URL, "http://h:99999"),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("http://h:99999"), "{err}");
}

#[test]
fn an_environment_that_is_not_utf8_never_panics() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let bytes = |b: &[u8]| OsString::from_vec(b.to_vec());
    let text = |s: &str| OsString::from(s);

    // Another program's variable: skipped.
    let env = text_environment(
        [
            (text("OTHER"), bytes(b"\xff")),
            (bytes(b"OTHER_\xff"), text("x")),
            (text("SENDGATE_DEPTH_TTL_MS"), text("5")),
        ]
        .into_iter(),
    )
    .unwrap();
    assert_eq!(
        Settings::from_vars(&env)
            .unwrap()
            .capacity
            .depth_ttl
            .as_millis(),
        5
    );

    // One of ours: refused, naming it, never showing the value.
    let err = text_environment(
        [(
            text("SENDGATE_RABBITMQ_URL"),
            bytes(b"amqp://u:s3cr3t\xff@h"),
        )]
        .into_iter(),
    )
    .unwrap_err();
    assert_eq!(err.variable(), Some("SENDGATE_RABBITMQ_URL"));
    assert!(!format!("{err} {err:?}").contains("s3cr3t"), "{err}");
    let err = text_environment([(bytes(b"SENDGATE_\xff"), text("x"))].into_iter()).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownVariable { .. }), "{err}");
    let env = text_environment([(text("SENDGATE_NOPE"), bytes(b"\xff"))].into_iter()).unwrap();
    assert!(matches!(
        Settings::from_vars(&env),
        Err(ConfigError::UnknownVariable { .. })
    ));
}

#[test]
fn a_credential_pasted_into_a_plain_variable_is_not_echoed() {
    // A connection string pasted into the namespace, a URL with a password in the endpoint
    // or the listen address: the variables are not secret, their value this time is.
    let key = "KeyKeyKey123=";
    let connection = format!(
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={key}"
    );
    for (var, value) in [
        (&v::SERVICEBUS_NAMESPACE, connection.as_str()),
        (&v::SERVICEBUS_ENDPOINT, connection.as_str()),
        (&v::SERVICEBUS_ENDPOINT, "https://u:KeyKeyKey123=@h:99999"),
        (&v::LISTEN, "amqp://u:KeyKeyKey123=@h:5672"),
        (&v::LISTEN, "u:KeyKeyKey123=@h:5672"),
    ] {
        let err =
            Settings::from_overrides(&[(&v::BACKEND, "servicebus"), (var, value)]).unwrap_err();
        assert_eq!(err.variable(), Some(var.name), "{err}");
        assert!(!format!("{err} {err:?}").contains(key), "{err}");
    }
    // An ordinary mistake is still shown.
    let err = Settings::from_overrides(&[(&v::LISTEN, "everywhere")]).unwrap_err();
    assert!(err.to_string().contains("everywhere"), "{err}");
}

#[test]
fn the_body_deadline_defaults_under_the_send_deadline_and_may_not_exceed_it() {
    let s = Settings::from_vars(&HashMap::new()).unwrap();
    assert_eq!(s.body_timeout, Duration::from_secs(5));
    assert_eq!(s.max_buffered_bytes, 64 * 1024 * 1024);
    assert_eq!(s.max_connections, 10_000);
    let s = Settings::from_vars(&vars(&[("SENDGATE_SEND_TIMEOUT_MS", "300")])).unwrap();
    assert_eq!(s.body_timeout, Duration::from_millis(300), "the shorter");
    let s = Settings::from_vars(&vars(&[("SENDGATE_BODY_TIMEOUT_MS", "10000")])).unwrap();
    assert_eq!(s.body_timeout, Duration::from_secs(10), "equal is fine");
    let err = Settings::from_vars(&vars(&[("SENDGATE_BODY_TIMEOUT_MS", "10001")])).unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_BODY_TIMEOUT_MS"),
        "{err}"
    );
}

#[test]
fn the_drain_linger_defaults_to_5_s_within_the_window_and_may_not_exceed_it() {
    let s = Settings::from_vars(&vars(&[])).unwrap();
    assert_eq!(s.drain_linger, Duration::from_secs(5));
    let s = Settings::from_vars(&vars(&[("SENDGATE_DRAIN_TIMEOUT_S", "2")])).unwrap();
    assert_eq!(
        s.drain_linger,
        Duration::from_secs(2),
        "the default fits the window"
    );
    let s = Settings::from_vars(&vars(&[("SENDGATE_DRAIN_LINGER_S", "0")])).unwrap();
    assert_eq!(s.drain_linger, Duration::ZERO);
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_DRAIN_TIMEOUT_S", "10"),
        ("SENDGATE_DRAIN_LINGER_S", "10"),
    ]))
    .unwrap();
    assert_eq!(s.drain_linger, Duration::from_secs(10));
    let err = Settings::from_vars(&vars(&[
        ("SENDGATE_DRAIN_TIMEOUT_S", "10"),
        ("SENDGATE_DRAIN_LINGER_S", "11"),
    ]))
    .unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_DRAIN_LINGER_S")
            && err.to_string().contains("SENDGATE_DRAIN_TIMEOUT_S"),
        "{err}"
    );
}

#[test]
fn the_memory_budget_holds_at_least_one_largest_body() {
    let err = Settings::from_vars(&vars(&[
        ("SENDGATE_MAX_BODY_BYTES", "2000"),
        ("SENDGATE_MAX_BUFFERED_BYTES", "1999"),
    ]))
    .unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_MAX_BUFFERED_BYTES"),
        "{err}"
    );
    assert!(Settings::from_vars(&vars(&[
        ("SENDGATE_MAX_BODY_BYTES", "2000"),
        ("SENDGATE_MAX_BUFFERED_BYTES", "2000"),
    ]))
    .is_ok());
}

#[test]
fn redis_coordination_needs_a_url_and_parses_its_settings() {
    assert_eq!(
        Settings::from_overrides(&[]).unwrap().coordination,
        CoordinationSettings::Local
    );
    let err = Settings::from_overrides(&[(&v::COORDINATION, "redis")]).unwrap_err();
    assert_eq!(err.variable(), Some("SENDGATE_REDIS_URL"));
    let settings = Settings::from_overrides(&[
        (&v::COORDINATION, "Redis"),
        (&v::REDIS_URL, "redis://app:pw@127.0.0.1:6379/3"),
        (&v::REDIS_PREFIX, "prod-eu"),
        (&v::REDIS_TIMEOUT_MS, "75"),
    ])
    .unwrap();
    let CoordinationSettings::Redis(redis) = settings.coordination else {
        panic!("redis coordination");
    };
    assert_eq!(
        redis.url.expose().as_str(),
        "redis://app:pw@127.0.0.1:6379/3"
    );
    assert_eq!(redis.auth, RedisAuth::Url);
    assert_eq!(redis.prefix.as_str(), "prod-eu");
    assert_eq!(redis.timeout, Duration::from_millis(75));
    assert!(
        !format!("{redis:?}").contains("pw@"),
        "the URL is never shown"
    );
    let err = Settings::from_overrides(&[
        (&v::COORDINATION, "redis"),
        (&v::REDIS_URL, "redis://127.0.0.1"),
        (&v::REDIS_PREFIX, "a b"),
    ])
    .unwrap_err();
    assert_eq!(err.variable(), Some("SENDGATE_REDIS_PREFIX"));
}

#[test]
fn entra_redis_auth_takes_the_user_assigned_identity_of_service_bus() {
    let entra = |extra: &[(&'static Var, &str)]| {
        let mut overrides: Vec<(&'static Var, &str)> = vec![
            (&v::COORDINATION, "redis"),
            (&v::REDIS_AUTH, "entra"),
            (
                &v::REDIS_URL,
                "rediss://00000000-1111-2222-3333-444444444444@cache.example:10000",
            ),
        ];
        overrides.extend_from_slice(extra);
        let settings = Settings::from_overrides(&overrides).unwrap();
        let CoordinationSettings::Redis(redis) = settings.coordination else {
            panic!("redis coordination");
        };
        redis.auth
    };
    assert_eq!(
        entra(&[]),
        RedisAuth::Entra {
            managed_identity_client_id: None
        },
        "system-assigned"
    );
    assert_eq!(
        entra(&[(
            &v::SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID,
            " 11111111-2222-3333-4444-555555555555 "
        )]),
        RedisAuth::Entra {
            managed_identity_client_id: Some("11111111-2222-3333-4444-555555555555".into())
        }
    );
    let err = Settings::from_overrides(&[
        (&v::COORDINATION, "redis"),
        (&v::REDIS_AUTH, "entra"),
        (&v::REDIS_URL, "rediss://user:token@cache.example:10000"),
    ])
    .unwrap_err();
    assert_eq!(err.variable(), Some("SENDGATE_REDIS_URL"));
    assert!(!err.to_string().contains("token@"), "{err}");
}

#[test]
fn the_resume_level_is_a_fraction_and_the_longest_retry_after_whole_seconds() {
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_RESUME_BELOW", "0.8"),
        ("SENDGATE_RETRY_AFTER_MAX_S", "60"),
    ]))
    .unwrap();
    assert_eq!(s.capacity.resume_below, Fraction::new(0.8).unwrap());
    assert_eq!(s.capacity.retry_after_max, Duration::from_secs(60));
    for bad in ["0", "1.5", "-0.2", "NaN", "most"] {
        let err = Settings::from_vars(&vars(&[("SENDGATE_RESUME_BELOW", bad)])).unwrap_err();
        assert!(
            err.to_string().starts_with("SENDGATE_RESUME_BELOW:"),
            "{bad}: {err}"
        );
    }
    for bad in ["0", "5s", "3601"] {
        let err = Settings::from_vars(&vars(&[("SENDGATE_RETRY_AFTER_MAX_S", bad)])).unwrap_err();
        assert!(
            err.to_string().starts_with("SENDGATE_RETRY_AFTER_MAX_S:"),
            "{bad}: {err}"
        );
    }
}

/// The Service Bus plan as the settings resolve it (`servicebus.rs`), each error naming the
/// variable read.
mod servicebus {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS0xMjM0NTY3ODkw";

    fn conn(host: &str, name: &str, entity: Option<&str>) -> String {
        let mut s =
            format!("Endpoint=sb://{host}/;SharedAccessKeyName={name};SharedAccessKey={KEY}");
        if let Some(e) = entity {
            s.push_str(&format!(";EntityPath={e}"));
        }
        s
    }

    fn plan_of(vars: &[(&str, &str)]) -> Result<ServiceBusSettings, ConfigError> {
        let mut env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.insert("SENDGATE_BACKEND".into(), "servicebus".into());
        match Settings::from_vars(&env)?.primary {
            BackendSettings::ServiceBus(s) => Ok(s),
            other => panic!("{other:?}"),
        }
    }

    fn key_name(p: &CredentialPlan) -> Option<&str> {
        match p {
            CredentialPlan::Sas(c) => Some(c.key_name.as_str()),
            CredentialPlan::EntraId => None,
        }
    }

    const NS_ID: &str =
        "/subscriptions/sub-1/resourceGroups/rg.one/providers/Microsoft.ServiceBus/namespaces/myns";

    #[test]
    fn the_depth_source_is_management_unless_arm_is_chosen_with_the_namespace_id() {
        let ns = ("SERVICEBUS_NAMESPACE", "myns");
        let p = plan_of(&[ns]).unwrap();
        assert_eq!(p.depth_source, ServiceBusDepthSource::Management);
        let arm = ("SENDGATE_SERVICEBUS_DEPTH_SOURCE", "ARM");
        let p = plan_of(&[ns, arm, ("SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID", NS_ID)]).unwrap();
        assert_eq!(
            p.depth_source,
            ServiceBusDepthSource::Arm {
                endpoint: "https://management.azure.com".into(),
                namespace_id: ArmNamespaceId::parse(NS_ID).unwrap(),
            }
        );
        let lower = NS_ID.to_ascii_lowercase();
        let p = plan_of(&[
            ns,
            arm,
            ("SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID", &lower),
            (
                "SENDGATE_SERVICEBUS_ARM_ENDPOINT",
                "https://management.usgovcloudapi.net/",
            ),
        ])
        .unwrap();
        assert_eq!(
            p.depth_source,
            ServiceBusDepthSource::Arm {
                endpoint: "https://management.usgovcloudapi.net".into(),
                namespace_id: ArmNamespaceId::parse(&lower).unwrap(),
            }
        );
    }

    #[test]
    fn the_arm_depth_source_refuses_a_missing_malformed_or_other_namespace_id() {
        let ns = ("SERVICEBUS_NAMESPACE", "myns");
        let arm = ("SENDGATE_SERVICEBUS_DEPTH_SOURCE", "arm");
        let err = plan_of(&[ns, arm]).unwrap_err();
        assert_eq!(err.variable(), Some("SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID"));
        let other = NS_ID.replace("/myns", "/otherns");
        for bad in [
            "myns",
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.EventHub/namespaces/myns",
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/myns/queues/q",
            "/subscriptions//resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/myns",
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/my ns",
            "subscriptions/s/resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/myns/",
            // A dot segment would walk the URL to another resource: never an ARM name.
            "/subscriptions/../resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/myns",
            "/subscriptions/s/resourceGroups/./providers/Microsoft.ServiceBus/namespaces/myns",
            "/subscriptions/s/resourceGroups/../providers/Microsoft.ServiceBus/namespaces/myns",
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/..",
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/.",
            other.as_str(),
        ] {
            let err =
                plan_of(&[ns, arm, ("SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID", bad)]).unwrap_err();
            assert_eq!(
                err.variable(),
                Some("SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID"),
                "{bad}"
            );
        }
        let err = plan_of(&[ns, ("SENDGATE_SERVICEBUS_DEPTH_SOURCE", "atom")]).unwrap_err();
        assert_eq!(err.variable(), Some("SENDGATE_SERVICEBUS_DEPTH_SOURCE"));
        // A test's endpoint names no namespace: any id of the right shape goes.
        let p = plan_of(&[
            ("SERVICEBUS_ENDPOINT", "http://127.0.0.1:9"),
            arm,
            ("SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID", &other),
        ]);
        assert!(p.is_ok(), "{p:?}");
    }

    /// A bad ARM endpoint's error shows ARM's URL as the example, not a namespace's.
    #[test]
    fn a_bad_arm_endpoint_is_refused_with_arms_own_example() {
        let ns = ("SERVICEBUS_NAMESPACE", "myns");
        let arm = ("SENDGATE_SERVICEBUS_DEPTH_SOURCE", "arm");
        let id = ("SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID", NS_ID);
        for bad in [
            "ftp://management.azure.com",
            "https://management.azure.com/?x=1",
        ] {
            let err =
                plan_of(&[ns, arm, id, ("SENDGATE_SERVICEBUS_ARM_ENDPOINT", bad)]).unwrap_err();
            assert_eq!(err.variable(), Some("SENDGATE_SERVICEBUS_ARM_ENDPOINT"));
            let text = err.to_string();
            assert!(text.contains("e.g. https://management.azure.com"), "{text}");
            assert!(!text.contains("servicebus.windows.net"), "{text}");
        }
        let err = plan_of(&[("SERVICEBUS_ENDPOINT", "ftp://myns")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("e.g. https://myns.servicebus.windows.net"),
            "{err}"
        );
    }

    #[test]
    fn nothing_set_is_an_error_naming_servicebus_namespace() {
        let err = plan_of(&[]).unwrap_err();
        assert_eq!(err.variable(), Some("SERVICEBUS_NAMESPACE"));
    }

    #[test]
    fn the_endpoint_comes_from_the_override_the_namespace_or_the_connection_string() {
        let cs = conn("fromconn.servicebus.windows.net", "send", None);
        let p = plan_of(&[("SERVICEBUS_CONNECTION_STRING", &cs)]).unwrap();
        assert_eq!(p.endpoint, "https://fromconn.servicebus.windows.net");

        let p = plan_of(&[("SERVICEBUS_NAMESPACE", "myns.servicebus.windows.net")]).unwrap();
        assert_eq!(p.endpoint, "https://myns.servicebus.windows.net");
        let p = plan_of(&[("SERVICEBUS_NAMESPACE", "MyNs")]).unwrap();
        assert_eq!(p.endpoint, "https://myns.servicebus.windows.net");
        let p = plan_of(&[(
            "SERVICEBUS_NAMESPACE",
            "https://myns.servicebus.windows.net/",
        )])
        .unwrap();
        assert_eq!(p.endpoint, "https://myns.servicebus.windows.net");

        let p = plan_of(&[
            ("SERVICEBUS_NAMESPACE", "myns.servicebus.windows.net"),
            ("SERVICEBUS_ENDPOINT", "http://127.0.0.1:9999/"),
        ])
        .unwrap();
        assert_eq!(p.endpoint, "http://127.0.0.1:9999");
    }

    #[test]
    fn bad_endpoints_and_namespaces_are_refused() {
        for bad in [
            "ftp://x",
            "not a url",
            "https://x/?a=b",
            "https://user:pw@x",
        ] {
            let err = plan_of(&[("SERVICEBUS_ENDPOINT", bad)]).unwrap_err();
            assert_eq!(err.variable(), Some("SERVICEBUS_ENDPOINT"), "{bad}");
        }
        for bad in ["my ns", "ns/queue", "https://"] {
            let err = plan_of(&[("SERVICEBUS_NAMESPACE", bad)]).unwrap_err();
            assert_eq!(err.variable(), Some("SERVICEBUS_NAMESPACE"), "{bad}");
        }
    }

    #[test]
    fn credentials_per_plane() {
        let send = conn("ns.servicebus.windows.net", "send", None);
        let manage = conn("ns.servicebus.windows.net", "manage", None);

        let p = plan_of(&[("SERVICEBUS_CONNECTION_STRING", &send)]).unwrap();
        assert_eq!(
            (key_name(&p.send), key_name(&p.manage)),
            (Some("send"), Some("send"))
        );

        let p = plan_of(&[
            ("SERVICEBUS_CONNECTION_STRING", &send),
            ("SERVICEBUS_MANAGE_CONNECTION_STRING", &manage),
        ])
        .unwrap();
        assert_eq!(
            (key_name(&p.send), key_name(&p.manage)),
            (Some("send"), Some("manage"))
        );

        let p = plan_of(&[("SERVICEBUS_NAMESPACE", "ns")]).unwrap();
        assert_eq!(
            (&p.send, &p.manage),
            (&CredentialPlan::EntraId, &CredentialPlan::EntraId)
        );

        let p = plan_of(&[("SERVICEBUS_MANAGE_CONNECTION_STRING", &manage)]).unwrap();
        assert_eq!(p.send, CredentialPlan::EntraId);
        assert_eq!(key_name(&p.manage), Some("manage"));
        assert_eq!(p.endpoint, "https://ns.servicebus.windows.net");
    }

    #[test]
    fn a_malformed_connection_string_names_its_variable_and_hides_the_key() {
        let raw = format!("Endpoint=http://ns/;SharedAccessKeyName=send;SharedAccessKey={KEY}");
        for var in [
            "SERVICEBUS_CONNECTION_STRING",
            "SERVICEBUS_MANAGE_CONNECTION_STRING",
        ] {
            let err = plan_of(&[(var, &raw)]).unwrap_err();
            assert_eq!(err.variable(), Some(var));
            assert!(!err.to_string().contains(KEY), "{err}");
        }
    }

    #[test]
    fn namespaces_must_agree() {
        let cs = conn("a.servicebus.windows.net", "send", None);
        let err = plan_of(&[
            ("SERVICEBUS_CONNECTION_STRING", &cs),
            ("SERVICEBUS_NAMESPACE", "b.servicebus.windows.net"),
        ])
        .unwrap_err();
        assert_eq!(err.variable(), Some("SERVICEBUS_NAMESPACE"));
        let other = conn("b.servicebus.windows.net", "manage", None);
        let err = plan_of(&[
            ("SERVICEBUS_CONNECTION_STRING", &cs),
            ("SERVICEBUS_MANAGE_CONNECTION_STRING", &other),
        ])
        .unwrap_err();
        assert_eq!(err.variable(), Some("SERVICEBUS_MANAGE_CONNECTION_STRING"));
    }

    #[test]
    fn a_queue_scoped_key_serves_only_its_queue() {
        let cs = conn("ns.servicebus.windows.net", "send", Some("requests"));
        assert!(plan_of(&[("SERVICEBUS_CONNECTION_STRING", &cs)]).is_ok());
        let err = plan_of(&[
            ("SERVICEBUS_CONNECTION_STRING", &cs),
            ("SENDGATE_QUEUES", "requests,other"),
        ])
        .unwrap_err();
        assert_eq!(err.variable(), Some("SERVICEBUS_CONNECTION_STRING"));
        assert!(err.to_string().contains("\"other\""), "{err}");
    }

    #[test]
    fn the_batch_limit_is_the_standard_tier_s_unless_set_and_stays_in_its_bounds() {
        let ns = ("SERVICEBUS_NAMESPACE", "ns");
        assert_eq!(plan_of(&[ns]).unwrap().max_batch_bytes, 262_144);
        let premium = plan_of(&[ns, ("SENDGATE_SERVICEBUS_MAX_BATCH_BYTES", "1048576")]);
        assert_eq!(premium.unwrap().max_batch_bytes, 1_048_576);
        assert_eq!(
            plan_of(&[ns, ("SENDGATE_SERVICEBUS_MAX_BATCH_BYTES", "1024")])
                .unwrap()
                .max_batch_bytes,
            1024
        );
        for bad in ["1023", "1048577", "256KB", "-1"] {
            let err = plan_of(&[ns, ("SENDGATE_SERVICEBUS_MAX_BATCH_BYTES", bad)]).unwrap_err();
            assert_eq!(
                err.variable(),
                Some("SENDGATE_SERVICEBUS_MAX_BATCH_BYTES"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_fallback_namespace_has_its_own_batch_limit_or_the_primary_s() {
        let fallback_limit = |pairs: &[(&'static Var, &str)]| {
            let mut all = vec![
                (&v::FALLBACK_BACKEND, "servicebus"),
                (&v::FALLBACK_SERVICEBUS_NAMESPACE, "other"),
            ];
            all.extend_from_slice(pairs);
            match Settings::from_overrides(&all).unwrap().fallback {
                Some(BackendSettings::ServiceBus(s)) => s.max_batch_bytes,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(fallback_limit(&[]), 262_144);
        assert_eq!(
            fallback_limit(&[(&v::SERVICEBUS_MAX_BATCH_BYTES, "500000")]),
            500_000,
            "unset, the primary's"
        );
        assert_eq!(
            fallback_limit(&[
                (&v::SERVICEBUS_MAX_BATCH_BYTES, "1048576"),
                (&v::FALLBACK_SERVICEBUS_MAX_BATCH_BYTES, "262144"),
            ]),
            262_144,
            "a Standard fallback under a Premium primary"
        );
        let err = Settings::from_overrides(&[
            (&v::FALLBACK_BACKEND, "servicebus"),
            (&v::FALLBACK_SERVICEBUS_NAMESPACE, "other"),
            (&v::FALLBACK_SERVICEBUS_MAX_BATCH_BYTES, "10"),
        ])
        .unwrap_err();
        assert_eq!(
            err.variable(),
            Some("SENDGATE_FALLBACK_SERVICEBUS_MAX_BATCH_BYTES")
        );
    }
}

#[test]
fn the_fair_settings_parse_and_a_lower_criticality_never_gets_more_of_the_ceiling() {
    let s = Settings::from_vars(&vars(&[])).unwrap();
    assert_eq!(s.fair.mode, FairMode::Enforce);
    assert_eq!(s.fair.share_at.get(), 0.9);
    assert_eq!(s.fair.shed_at_sheddable.get(), 0.8);
    assert_eq!(s.fair.shed_at_default.get(), 1.0);
    let s = Settings::from_vars(&vars(&[("SENDGATE_FAIR_SHARE", "off")])).unwrap();
    assert_eq!(s.fair.mode, FairMode::Off);
    let s = Settings::from_vars(&vars(&[("SENDGATE_FAIR_SHARE", "shadow")])).unwrap();
    assert_eq!(s.fair.mode, FairMode::Shadow);
    assert!(Settings::from_vars(&vars(&[("SENDGATE_FAIR_SHARE", "shade")])).is_err());
    let err = Settings::from_vars(&vars(&[
        ("SENDGATE_SHED_AT_SHEDDABLE", "0.95"),
        ("SENDGATE_SHED_AT_DEFAULT", "0.8"),
    ]))
    .unwrap_err();
    assert!(
        err.to_string().starts_with("SENDGATE_SHED_AT_SHEDDABLE")
            && err.to_string().contains("SENDGATE_SHED_AT_DEFAULT"),
        "{err}"
    );
    assert!(Settings::from_vars(&vars(&[
        ("SENDGATE_SHED_AT_SHEDDABLE", "0.8"),
        ("SENDGATE_SHED_AT_DEFAULT", "0.8"),
    ]))
    .is_ok());
}

#[test]
fn entra_callers_need_a_tenant_guid_and_an_audience_and_name_the_variable() {
    const TENANT: &str = "11111111-2222-3333-4444-555555555555";
    let s = Settings::from_vars(&vars(&[
        ("SENDGATE_LISTEN", "0.0.0.0:8080"),
        ("SENDGATE_ENTRA_TENANT_ID", TENANT),
        (
            "SENDGATE_ENTRA_AUDIENCE",
            " api://sendgate , 99999999-8888-7777-6666-555555555555,api://sendgate",
        ),
    ]))
    .unwrap();
    let AuthSettings::Callers {
        keys_file: None,
        entra: Some(entra),
    } = s.auth
    else {
        panic!("Entra alone is a way in: {:?}", s.auth);
    };
    assert_eq!(entra.tenant.as_str(), TENANT);
    assert_eq!(
        entra.audiences,
        ["api://sendgate", "99999999-8888-7777-6666-555555555555"]
    );
    assert_eq!(
        entra.discovery_url(),
        format!("https://login.microsoftonline.com/{TENANT}/v2.0/.well-known/openid-configuration")
    );
    assert_eq!(entra.allowed_apps, None);

    let refused = |pairs: &[(&str, &str)]| {
        Settings::from_vars(&vars(pairs))
            .unwrap_err()
            .variable()
            .map(str::to_owned)
    };
    let tenant = ("SENDGATE_ENTRA_TENANT_ID", TENANT);
    let audience = ("SENDGATE_ENTRA_AUDIENCE", "api://sendgate");
    for (pairs, var) in [
        (
            vec![
                ("SENDGATE_ENTRA_TENANT_ID", "contoso.onmicrosoft.com"),
                audience,
            ],
            "SENDGATE_ENTRA_TENANT_ID",
        ),
        (vec![tenant], "SENDGATE_ENTRA_AUDIENCE"),
        (
            vec![tenant, ("SENDGATE_ENTRA_AUDIENCE", "a,b,c,d,e")],
            "SENDGATE_ENTRA_AUDIENCE",
        ),
        (
            vec![
                tenant,
                audience,
                ("SENDGATE_ENTRA_AUTHORITY", "http://login.example.com"),
            ],
            "SENDGATE_ENTRA_AUTHORITY",
        ),
        (
            vec![tenant, audience, ("SENDGATE_ENTRA_ALLOWED_APPS", "app-one")],
            "SENDGATE_ENTRA_ALLOWED_APPS",
        ),
        // Set without the tenant, they would be ignored: refused instead.
        (vec![audience], "SENDGATE_ENTRA_TENANT_ID"),
        (
            vec![tenant, audience, ("SENDGATE_AUTH", "none")],
            "SENDGATE_AUTH",
        ),
    ] {
        assert_eq!(refused(&pairs).as_deref(), Some(var), "{pairs:?}");
    }
    let s = Settings::from_vars(&vars(&[
        tenant,
        audience,
        ("SENDGATE_ENTRA_AUTHORITY", "http://127.0.0.1:9/"),
        (
            "SENDGATE_ENTRA_ALLOWED_APPS",
            "AAAAAAAA-0000-0000-0000-000000000001, aaaaaaaa-0000-0000-0000-000000000001",
        ),
    ]))
    .unwrap();
    let AuthSettings::Callers {
        entra: Some(entra), ..
    } = s.auth
    else {
        panic!("{:?}", s.auth);
    };
    assert_eq!(entra.authority, "http://127.0.0.1:9");
    assert_eq!(
        entra.allowed_apps.unwrap(),
        [Guid::parse("aaaaaaaa-0000-0000-0000-000000000001").unwrap()]
    );
}

#[test]
fn otlp_headers_are_parsed_percent_decoded_sensitive_and_per_signal() {
    let s = Settings::from_vars(&vars(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            " api-key = s%3Dcr%2Cet , x-tenant=a b,,",
        ),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-metrics=1"),
    ]))
    .unwrap();
    let pairs = |h: &ExportHeaders| -> Vec<(String, String)> {
        h.iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect()
    };
    assert_eq!(
        pairs(&s.otel.traces.as_ref().unwrap().headers),
        [
            ("api-key".to_owned(), "s=cr,et".to_owned()),
            ("x-tenant".to_owned(), "a b".to_owned())
        ]
    );
    assert!(s
        .otel
        .traces
        .as_ref()
        .unwrap()
        .headers
        .iter()
        .all(|(_, v)| v.is_sensitive()));
    assert_eq!(
        pairs(&s.otel.metrics.as_ref().unwrap().headers),
        [("x-metrics".to_owned(), "1".to_owned())],
        "a signal's own headers replace the common ones"
    );
    let shown = format!("{:?}", s.otel);
    assert!(
        !shown.contains("cr") && shown.contains("api-key"),
        "{shown}"
    );

    let unset = Settings::from_vars(&vars(&[(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "http://collector:4318",
    )]))
    .unwrap();
    assert_eq!(unset.otel.traces.unwrap().headers, ExportHeaders::default());
}

#[test]
fn over_grpc_a_header_name_must_be_a_grpc_metadata_name() {
    // `x!y` is an HTTP header name, not a gRPC metadata key (0-9 a-z - _ .): gRPC refuses
    // every call that carries it, so start-up says so, naming the header, not its value.
    let settings = |pairs: &[(&str, &str)]| {
        let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")];
        all.extend_from_slice(pairs);
        Settings::from_vars(&vars(&all))
    };
    let err = settings(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=K3Y-VALUE,x!y=1"),
    ])
    .unwrap_err();
    let shown = err.to_string();
    assert_eq!(
        err.variable(),
        Some("OTEL_EXPORTER_OTLP_HEADERS"),
        "{shown}"
    );
    assert!(shown.contains("x!y"), "{shown}");
    assert!(!shown.contains("K3Y-VALUE"), "{shown}");
    // A signal's own headers, over its own protocol.
    let err = settings(&[
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x@m=1"),
    ])
    .unwrap_err();
    assert_eq!(err.variable(), Some("OTEL_EXPORTER_OTLP_METRICS_HEADERS"));
    // Over HTTP the same names are headers as any other; and over gRPC the usual ones pass.
    assert!(settings(&[("OTEL_EXPORTER_OTLP_HEADERS", "x!y=1")]).is_ok());
    assert!(settings(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "API-Key=1,x_a.b-c=2,x-token-bin=3"
        ),
    ])
    .is_ok());
}

#[test]
fn otlp_endpoints_follow_each_signals_protocol() {
    let endpoints = |pairs: &[(&str, &str)]| {
        let s = Settings::from_vars(&vars(pairs)).unwrap().otel;
        let show = |e: Option<SignalExport>| e.map(|e| (e.protocol, e.endpoint));
        (show(s.traces), show(s.metrics), s.unsupported_protocols)
    };
    let http = OtlpProtocol::HttpProtobuf;
    let grpc = OtlpProtocol::Grpc;
    // The default: OTLP/HTTP, the signal's path under the base.
    assert_eq!(
        endpoints(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]),
        (
            Some((http, "http://c:4318/v1/traces".into())),
            Some((http, "http://c:4318/v1/metrics".into())),
            vec![]
        )
    );
    // What the Container Apps agent injects: gRPC, the base used as it is.
    assert_eq!(
        endpoints(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://agent:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", " GRPC "),
        ]),
        (
            Some((grpc, "http://agent:4317".into())),
            Some((grpc, "http://agent:4317".into())),
            vec![]
        )
    );
    // A signal's own protocol and endpoint win over the common ones.
    assert_eq!(
        endpoints(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://t/x"),
        ]),
        (
            Some((http, "https://t/x".into())),
            Some((grpc, "http://c:4318".into())),
            vec![]
        )
    );
    // A value naming no protocol built in is kept to be logged, and ignored.
    assert_eq!(
        endpoints(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
        ]),
        (
            Some((grpc, "http://c:4317".into())),
            Some((grpc, "http://c:4317".into())),
            vec![("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json".into())]
        )
    );
    // Disabled: nothing, whatever the endpoints say.
    assert_eq!(
        endpoints(&[
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "not a url"),
        ]),
        (None, None, vec![])
    );
}

#[test]
fn otlp_compression_is_read_so_it_can_be_said_unsupported() {
    let s = Settings::from_vars(&vars(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
    ]))
    .unwrap();
    assert_eq!(s.otel.compression.as_deref(), Some("gzip"));
    let unset = Settings::from_vars(&vars(&[])).unwrap();
    assert_eq!(unset.otel.compression, None);
}

#[test]
fn a_bad_otlp_header_is_a_config_error_that_shows_no_value() {
    for bad in ["api-key", "bad name=1", "k=v\u{7f}", "k=%0A"] {
        let err = Settings::from_vars(&vars(&[(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            &format!("secret-{bad}"),
        )]))
        .expect_err(bad)
        .to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_TRACES_HEADERS"), "{err}");
        assert!(!err.contains("secret-"), "the value is not shown: {err}");
    }
}

#[test]
fn otlp_export_is_enabled_by_either_signal_and_an_endpoint_needs_a_host() {
    let otel = |pairs: &[(&str, &str)]| Settings::from_vars(&vars(pairs)).map(|s| s.otel);
    assert!(!otel(&[]).unwrap().enabled(), "nothing set: nothing built");
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ] {
        let one = otel(&[(var, "http://c:4318/x")]).unwrap();
        assert!(one.enabled(), "{var} alone exports");
        assert_eq!(
            one.traces.is_some(),
            var.contains("TRACES"),
            "{var}: the other signal stays off"
        );
    }
    for bad in ["http://", "https:///v1", "ftp://c:4318", "c:4318"] {
        let err = otel(&[("OTEL_EXPORTER_OTLP_ENDPOINT", bad)])
            .expect_err(bad)
            .to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{bad}: {err}");
    }
    assert!(otel(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "HTTPS://c")]).is_ok());
}

/// Issue 41: `OTEL_METRICS_EXPORTER=none` (the specification's) exports no metrics, the
/// spans still; `otlp` is the default; any other value is kept for a warning and ignored
/// (the specification: an unrecognised enum value MUST be warned about and ignored), so the
/// metrics go out over OTLP and start-up goes on.
#[test]
fn otel_metrics_exporter_none_turns_the_metrics_export_off_and_leaves_the_spans() {
    let otel = |pairs: &[(&str, &str)]| Settings::from_vars(&vars(pairs)).map(|s| s.otel);
    let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
    let none = otel(&[base, ("OTEL_METRICS_EXPORTER", "none")]).unwrap();
    assert!(none.metrics.is_none() && none.traces.is_some(), "{none:?}");
    assert!(none.enabled(), "the spans are still exported");
    let own = otel(&[
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://c:4318/v1/metrics",
        ),
        ("OTEL_METRICS_EXPORTER", "NONE"),
    ])
    .unwrap();
    assert!(own.metrics.is_none() && !own.enabled(), "{own:?}");
    assert_eq!(none.unsupported_metrics_exporter, None);
    for otlp in [&[base][..], &[base, ("OTEL_METRICS_EXPORTER", "otlp")]] {
        let otlp = otel(otlp).unwrap();
        assert!(otlp.metrics.is_some(), "{otlp:?}");
        assert_eq!(otlp.unsupported_metrics_exporter, None);
    }
    // The specification: an empty value is as if unset; the value is a comma-separated list.
    for unset in ["", "  ", " , "] {
        let otlp = otel(&[base, ("OTEL_METRICS_EXPORTER", unset)]).unwrap();
        assert!(otlp.metrics.is_some(), "{unset:?}");
        assert_eq!(otlp.unsupported_metrics_exporter, None, "{unset:?}");
    }
    for (value, unsupported) in [
        ("prometheus", "prometheus"),
        ("otlp,console", "console"),
        (" Zipkin ", "Zipkin"),
        ("otlp, prometheus ,console", "prometheus,console"),
    ] {
        let ignored = otel(&[base, ("OTEL_METRICS_EXPORTER", value)])
            .unwrap_or_else(|e| panic!("{value:?} stopped start-up: {e}"));
        assert!(ignored.metrics.is_some(), "{value:?}: as otlp");
        assert_eq!(
            ignored.unsupported_metrics_exporter.as_deref(),
            Some(unsupported),
            "the names not built in, for the warning"
        );
    }
    let both = otel(&[base, ("OTEL_METRICS_EXPORTER", "otlp,none")]).unwrap();
    assert!(both.metrics.is_some(), "otlp named: exported");
}
