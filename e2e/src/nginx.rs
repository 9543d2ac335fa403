//! A real nginx (Debian's package, unpacked by `e2e/nginx/install.sh` into the cache) on
//! loopback, running a shipped configuration such as `manifests/grpc-proxy/nginx.conf.template`
//! inside a minimal main configuration of the test's own: everything (pid, logs, temporary
//! files) in the test's directory, one process, no user switch.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::{
    binaries::cached_program,
    error::{Error, Result, io_err},
    process::ManagedProcess,
};

/// How long nginx may take to listen.
const READY: Duration = Duration::from_secs(20);

/// The nginx binary `make nginx` unpacks.
pub fn binary() -> Result<PathBuf> {
    cached_program("nginx/current/usr/sbin/nginx", |path| Error::NginxMissing {
        path,
    })
}

/// `template` with each `${NAME}` of `vars` replaced; fails when a variable does not occur
/// (the template changed under the test) or a `${...}` is left over.
pub fn render(template: &str, vars: &[(&str, &str)]) -> std::result::Result<String, String> {
    let mut out = template.to_string();
    for (name, value) in vars {
        let placeholder = format!("${{{name}}}");
        if !out.contains(&placeholder) {
            return Err(format!("the template has no {placeholder}"));
        }
        out = out.replace(&placeholder, value);
    }
    match out.find("${") {
        Some(at) => Err(format!(
            "the template has a variable the test does not set: {}",
            out[at..].lines().next().unwrap_or_default()
        )),
        None => Ok(out),
    }
}

/// A running nginx.
pub struct Nginx {
    process: ManagedProcess,
    dir: PathBuf,
}

impl Nginx {
    /// Starts nginx in `dir` with `server` (a configuration for the http {} context, e.g. a
    /// rendered shipped template) and `http_directives` (the test's own http-level lines),
    /// and waits until `listen` accepts connections.
    pub async fn start(
        dir: &Path,
        server: &str,
        http_directives: &str,
        listen: SocketAddr,
    ) -> Result<Nginx> {
        let binary = binary()?;
        std::fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
        let d = dir.display();
        let server_file = dir.join("server.conf");
        std::fs::write(&server_file, server)
            .map_err(io_err(format!("write {}", server_file.display())))?;
        let main = format!(
            "daemon off;\n\
             master_process off;\n\
             worker_processes 1;\n\
             pid {d}/nginx.pid;\n\
             error_log {d}/error.log info;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n\
             \x20   access_log {d}/access.log;\n\
             \x20   client_body_temp_path {d}/client_body;\n\
             \x20   proxy_temp_path {d}/proxy;\n\
             \x20   fastcgi_temp_path {d}/fastcgi;\n\
             \x20   uwsgi_temp_path {d}/uwsgi;\n\
             \x20   scgi_temp_path {d}/scgi;\n\
             \x20   {http_directives}\n\
             \x20   include {};\n\
             }}\n",
            server_file.display()
        );
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, main).map_err(io_err(format!("write {}", conf.display())))?;
        let mut command = Command::new(&binary);
        command
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("error.log"));
        let mut process = ManagedProcess::spawn_command("nginx", command, dir.join("nginx.log"))?;
        crate::process::wait_listening(
            &mut process,
            listen,
            "nginx",
            &dir.join("error.log"),
            READY,
        )
        .await?;
        Ok(Nginx {
            process,
            dir: dir.to_path_buf(),
        })
    }

    /// nginx's error log so far (TLS handshake and upstream errors are logged there).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    /// Stops nginx.
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn render_substitutes_every_variable_and_leaves_none() {
        let template =
            "listen ${LISTEN} ssl;\ngrpc_pass grpc://${HUB};\nset $x $ssl_client_escaped_cert;";
        let out = render(template, &[("LISTEN", "9091"), ("HUB", "hub:9091")]).unwrap();
        assert_eq!(
            out,
            "listen 9091 ssl;\ngrpc_pass grpc://hub:9091;\nset $x $ssl_client_escaped_cert;"
        );
        assert!(
            render(template, &[("LISTEN", "1")])
                .unwrap_err()
                .contains("${HUB}")
        );
        assert!(
            render(template, &[("LISTEN", "1"), ("HUB", "h"), ("TLS", "t")])
                .unwrap_err()
                .contains("${TLS}")
        );
    }
}
