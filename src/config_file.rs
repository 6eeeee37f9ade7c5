//! The config file `idemgate serve` started from, as a SIGHUP finds it:
//! a reload reads only the listeners' certificates again, so a file
//! edited since the start is said to be one, with whether it would start,
//! rather than left for the operator to believe applied.

use std::path::PathBuf;

use idemgate::config::Config;
use idemgate::server::Gateway;
use idemgate_tools::cli::Serve;

/// The file's bytes as the start read them.
pub struct StartedFrom {
    path: PathBuf,
    text: Option<Vec<u8>>,
    /// Started with `--accept-route-changes`, as a restart would be.
    accept_route_changes: bool,
}

impl StartedFrom {
    /// The file `serve` names, read now; `None` without `--config`.
    pub fn read(serve: &Serve) -> Option<StartedFrom> {
        let path = serve.config_file()?.to_path_buf();
        let text = std::fs::read(&path).ok();
        let accept_route_changes = serve.accept_route_changes;
        Some(StartedFrom {
            path,
            text,
            accept_route_changes,
        })
    }

    /// Logs a warning when the file is not what the start read, saying
    /// whether it would start: read, and over what `gateway`'s store holds
    /// now (a route change that would leave held operations unfound).
    pub async fn warn_if_changed(&self, gateway: &Gateway) {
        let path = self.path.display();
        match std::fs::read(&self.path) {
            Ok(now) if Some(&now) == self.text.as_ref() => {}
            Ok(_) => match Config::load(&self.path) {
                Ok(config) => match gateway
                    .refusal_of(&config.routes, self.accept_route_changes)
                    .await
                {
                    None => tracing::warn!(
                        %path,
                        "the config file changed since the start: a reload reads only the listeners' certificates again; restart to apply it"
                    ),
                    Some(error) => tracing::warn!(
                        %path,
                        %error,
                        "the config file changed since the start, and would not start over the operations the store holds; a reload reads only the listeners' certificates again"
                    ),
                },
                Err(error) => tracing::warn!(
                    %path,
                    %error,
                    "the config file changed since the start, and would not start; a reload reads only the listeners' certificates again"
                ),
            },
            Err(error) => {
                tracing::warn!(%path, %error, "the config file cannot be read; a restart would fail")
            }
        }
    }
}
