//! What the standard `OTEL_*` variables ask of the traces (docs/deploying.md,
//! "Traces"), read once at start through the caller's lookup (tests run
//! many gateways in one process, each with its own variables).
//!
//! Invariant: tracing is off unless an OTLP endpoint is named, and off
//! whatever is named when `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none`. A variable that is set but cannot be used
//! stops the start with its name, rather than silently tracing otherwise
//! than asked.

use std::time::Duration;

use percent_encoding::percent_decode_str;

/// A traces variable that is set but cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{variable}: {reason}")]
pub struct TraceSettingError {
    pub(crate) variable: &'static str,
    pub(crate) reason: String,
}

/// Which spans are kept (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    AlwaysOn,
    AlwaysOff,
    /// The ratio of trace ids kept, 0 to 1.
    Ratio(f64),
    /// The client's decision when its `traceparent` carries one, else `root`'s.
    ParentBased(Root),
}

/// What a [`Sampling::ParentBased`] sampler does for a request without a
/// parent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
}

/// The traces as configured: where they go and what is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The collector's URL for traces (`…/v1/traces`).
    pub(crate) endpoint: String,
    /// Sent with every export (a collector's credentials): never logged.
    pub(crate) headers: Vec<(String, String)>,
    /// One export's bound, connect to the end of the collector's answer.
    pub(crate) timeout: Duration,
    pub(crate) service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, as given.
    pub(crate) resource: Vec<(String, String)>,
    pub(crate) sampling: Sampling,
    /// The longest an ended span waits before its batch is exported.
    pub(crate) schedule_delay: Duration,
    /// Ended spans that wait for export at most; past it they are dropped
    /// (and counted), never waited for.
    pub(crate) max_queue: usize,
    pub(crate) max_batch: usize,
}

/// The sampler when none is named: the client's decision, else every trace.
const DEFAULT_SAMPLING: Sampling = Sampling::ParentBased(Root::AlwaysOn);

impl TraceSettings {
    /// The settings `var` gives; `None`: tracing is off.
    pub fn from_env(
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<TraceSettings>, TraceSettingError> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match set("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(invalid(
                    "OTEL_TRACES_EXPORTER",
                    format!("`{other}`: only `otlp` (and `none`) are supported"),
                ));
            }
        }
        let endpoint = match (
            set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            set("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            // The signal's own URL is used as given, the base gets the path.
            (Some(url), _) => checked_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url.trim())?,
            (None, Some(base)) => checked_url(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &format!("{}/v1/traces", base.trim().trim_end_matches('/')),
            )?,
            (None, None) => return Ok(None),
        };
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = set(name) {
                if protocol.trim() != "http/protobuf" {
                    return Err(invalid(
                        name,
                        format!("`{protocol}`: only `http/protobuf` is supported"),
                    ));
                }
                break;
            }
        }
        let (headers_var, headers) = first_set(
            &set,
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        );
        let headers = headers
            .map(|h| pairs(headers_var, &h))
            .transpose()?
            .unwrap_or_default();
        // The exporter would drop a pair it cannot send, a credential
        // among them, without a word: refused here, the value never shown.
        for (n, (name, value)) in headers.iter().enumerate() {
            // Not shown either: written `Authorization: Basic …`, the
            // "name" is the credential.
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(invalid(
                    headers_var,
                    format!(
                        "pair {} has no header name before its `=` (pairs read `name=value`, the value percent-encoded)",
                        n + 1
                    ),
                ));
            }
            if http::HeaderValue::from_str(value).is_err() {
                return Err(invalid(
                    headers_var,
                    format!("the value of `{name}` is not a valid header value"),
                ));
            }
        }
        let (timeout_var, timeout) = first_set(
            &set,
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        );
        let timeout = millis(timeout_var, timeout, 10_000)?;
        let resource = set("OTEL_RESOURCE_ATTRIBUTES")
            .map(|r| pairs("OTEL_RESOURCE_ATTRIBUTES", &r))
            .transpose()?
            .unwrap_or_default();
        let service_name = set("OTEL_SERVICE_NAME")
            .map(|name| name.trim().to_string())
            .or_else(|| {
                resource
                    .iter()
                    .find(|(k, _)| k == "service.name")
                    .map(|(_, v)| v.clone())
            })
            .unwrap_or_else(|| "idemgate".into());
        let sampling = sampling(&set)?;
        let schedule_delay = millis(
            "OTEL_BSP_SCHEDULE_DELAY",
            set("OTEL_BSP_SCHEDULE_DELAY"),
            5_000,
        )?;
        let max_queue = count("OTEL_BSP_MAX_QUEUE_SIZE", &set, 2_048)?;
        let max_batch = count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &set, 512)?.min(max_queue);
        Ok(Some(TraceSettings {
            endpoint,
            headers,
            timeout,
            service_name,
            resource,
            sampling,
            schedule_delay,
            max_queue,
            max_batch,
        }))
    }
}

fn invalid(variable: &'static str, reason: String) -> TraceSettingError {
    TraceSettingError { variable, reason }
}

/// The signal's variable if set, else the general one: its name and value.
fn first_set(
    set: &dyn Fn(&str) -> Option<String>,
    signal: &'static str,
    general: &'static str,
) -> (&'static str, Option<String>) {
    match set(signal) {
        Some(value) => (signal, Some(value)),
        None => (general, set(general)),
    }
}

/// An http(s) URL with a host and no userinfo: a password there would be
/// printed by the exporter's own logging (at `RUST_LOG=trace`) and by any
/// error that shows the URL; credentials go in `OTEL_EXPORTER_OTLP_HEADERS`,
/// which is never printed. Refused without echoing the value, which may
/// hold one.
fn checked_url(variable: &'static str, url: &str) -> Result<String, TraceSettingError> {
    // Up to the query: a user or password may hold `/` (`u:pa/ss@host`),
    // and a URL without a scheme is all authority.
    let before_query = url.split(['?', '#']).next().unwrap_or_default();
    if before_query.contains('@') {
        return Err(invalid(
            variable,
            "the URL names a user or password (`user:password@`); put credentials in \
             OTEL_EXPORTER_OTLP_HEADERS (`authorization=Basic%20…`) instead"
                .into(),
        ));
    }
    // Not echoed: whatever it holds stays out of the logs.
    let uri: http::Uri = url
        .parse()
        .map_err(|e| invalid(variable, format!("it is not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.authority().is_some() => Ok(url.to_string()),
        _ => Err(invalid(
            variable,
            "it is not an http:// or https:// URL".into(),
        )),
    }
}

/// `k=v,k2=v2` with percent-encoded values (the OTLP exporter's and the
/// resource's format).
fn pairs(variable: &'static str, text: &str) -> Result<Vec<(String, String)>, TraceSettingError> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| invalid(variable, "a pair without `=`".into()))?;
            let value = percent_decode_str(value.trim())
                .decode_utf8()
                .map_err(|_| invalid(variable, "a value that is not UTF-8".into()))?;
            Ok((key.trim().to_string(), value.into_owned()))
        })
        .collect()
}

fn millis(
    variable: &'static str,
    value: Option<String>,
    default: u64,
) -> Result<Duration, TraceSettingError> {
    let Some(value) = value else {
        return Ok(Duration::from_millis(default));
    };
    value
        .trim()
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| invalid(variable, format!("`{value}` is not milliseconds")))
}

fn count(
    variable: &'static str,
    set: &dyn Fn(&str) -> Option<String>,
    default: usize,
) -> Result<usize, TraceSettingError> {
    let Some(value) = set(variable) else {
        return Ok(default);
    };
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(invalid(
            variable,
            format!("`{value}` is not a positive number"),
        )),
    }
}

fn sampling(set: &dyn Fn(&str) -> Option<String>) -> Result<Sampling, TraceSettingError> {
    let ratio = || -> Result<f64, TraceSettingError> {
        let Some(arg) = set("OTEL_TRACES_SAMPLER_ARG") else {
            return Ok(1.0);
        };
        match arg.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(invalid(
                "OTEL_TRACES_SAMPLER_ARG",
                format!("`{arg}` is not a ratio from 0 to 1"),
            )),
        }
    };
    let Some(sampler) = set("OTEL_TRACES_SAMPLER") else {
        return Ok(DEFAULT_SAMPLING);
    };
    Ok(match sampler.trim() {
        "always_on" => Sampling::AlwaysOn,
        "always_off" => Sampling::AlwaysOff,
        "traceidratio" => Sampling::Ratio(ratio()?),
        "parentbased_always_on" => Sampling::ParentBased(Root::AlwaysOn),
        "parentbased_always_off" => Sampling::ParentBased(Root::AlwaysOff),
        "parentbased_traceidratio" => Sampling::ParentBased(Root::Ratio(ratio()?)),
        other => {
            return Err(invalid(
                "OTEL_TRACES_SAMPLER",
                format!(
                    "`{other}`: one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                ),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<Option<TraceSettings>, TraceSettingError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TraceSettings::from_env(&|name| vars.get(name).cloned())
    }

    #[test]
    fn off_without_an_endpoint_or_when_disabled() {
        assert_eq!(read(&[]).unwrap(), None);
        assert_eq!(read(&[("OTEL_SERVICE_NAME", "x")]).unwrap(), None);
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert!(read(&[endpoint]).unwrap().is_some());
        assert_eq!(
            read(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]).unwrap(),
            None
        );
        assert_eq!(
            read(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).unwrap(),
            None
        );
    }

    #[test]
    fn the_signals_endpoint_is_used_as_given_the_base_gets_the_path() {
        let base = read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")])
            .unwrap()
            .unwrap();
        assert_eq!(base.endpoint, "http://c:4318/v1/traces");
        let own = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://t/x"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(own.endpoint, "https://t/x");
        assert_eq!(own.service_name, "idemgate");
        assert_eq!(own.sampling, DEFAULT_SAMPLING);
        assert_eq!(own.timeout, Duration::from_secs(10));
        assert_eq!((own.max_queue, own.max_batch), (2048, 512));
    }

    #[test]
    fn variables_are_read_as_the_specification_writes_them() {
        let settings = read(&[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c/v1/traces"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20t, x-a=1",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "250"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=api-gw,deployment.environment=prod",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "8"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            settings.headers,
            [
                ("authorization".to_string(), "Bearer t".to_string()),
                ("x-a".into(), "1".into())
            ]
        );
        assert_eq!(settings.timeout, Duration::from_millis(250));
        assert_eq!(settings.service_name, "api-gw");
        assert_eq!(settings.sampling, Sampling::ParentBased(Root::Ratio(0.25)));
        assert_eq!(settings.schedule_delay, Duration::from_millis(20));
        // A batch is never larger than the queue it is taken from.
        assert_eq!((settings.max_queue, settings.max_batch), (8, 8));
    }

    #[test]
    fn what_cannot_be_used_is_refused_by_name() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c");
        for (vars, variable) in [
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_SAMPLER", "jaeger_remote")],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                vec![
                    endpoint,
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                vec![endpoint, ("OTEL_BSP_MAX_QUEUE_SIZE", "0")],
                "OTEL_BSP_MAX_QUEUE_SIZE",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER",
            ),
        ] {
            let error = read(&vars).expect_err(variable);
            assert_eq!(error.variable, variable, "{error}");
        }
    }

    /// A pair the exporter could not send (a credential, say) stops the
    /// start, naming the variable and the header, never the value.
    #[test]
    fn a_header_that_cannot_be_sent_is_refused_without_showing_it() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        for headers in [
            "bad header=s3cret,x-ok=1",
            "authorization=Bearer%0As3cret",
            "Authorization: Basic s3cret==",
        ] {
            let error =
                read(&[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", headers)]).expect_err(headers);
            assert_eq!(error.variable, "OTEL_EXPORTER_OTLP_HEADERS", "{error}");
            assert!(!error.to_string().contains("s3cret"), "{error}");
        }
    }

    #[test]
    fn an_endpoint_with_a_password_is_refused_without_showing_it() {
        for (variable, url) in [
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://u:s3cret@c:4318/v1/traces",
            ),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://s3cret@c:4318"),
        ] {
            let error = read(&[(variable, url)]).expect_err(url);
            assert_eq!(error.variable, variable, "{error}");
            let shown = error.to_string();
            assert!(shown.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{shown}");
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        // An `@` in the path or query is no userinfo.
        let at_in_path = read(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces?for=a@b",
        )]);
        assert!(at_in_path.is_ok());
    }
}
