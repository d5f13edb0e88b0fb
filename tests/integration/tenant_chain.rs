//! Issue 37, end to end: two tenants (two tokens) share one `ipybox serve --http` with local
//! kernels. Tenant B's cell tries the whole chain the issue found:
//! read the operator's token file (under `/etc`, as the docs recommend), find ipybox's port in
//! `/proc/net/tcp`, and with a token read tenant A's notebook (its code and outputs) through
//! `resources/read` on ipybox's own port, directly and through the proxy the kernel is given.
//! Confined (the default), every step fails; the control (`--unconfined-sessions`) runs the same
//! code and reads A's notebook. Both MCP eras.

use std::path::Path;

use rmcp::model::{ReadResourceRequestParams, ResourceContents};

use crate::http_support::*;
use crate::mcp_eras::{Era, both_eras};
use crate::support::*;

/// What tenant A's notebook holds and tenant B wants.
const A_PRIVATE: &str = "tenant-a-private-7c1d";

/// Tenant B's attack: prints one `step=outcome` line per step. It uses the first token of the
/// file (A's), or `token` (A's, as if leaked another way: the network must stop it too).
fn attack(token_file: &Path, port: u16, uri: &str, token: &str) -> String {
    format!(
        r#"import json, os, urllib.request, urllib.error
_r = []
try:
    _toks = [l.strip() for l in open({token_file:?}) if l.strip() and not l.startswith('#')]
    _r.append('tokens=read')
except OSError as e:
    _toks = []
    _r.append('tokens=' + type(e).__name__)
_ports = set()
for _f in ('tcp', 'tcp6'):
    # A table that cannot be read is said (and fails the test), not taken for an empty one.
    try:
        _lines = open('/proc/net/' + _f).read().splitlines()[1:]
        _r.append(_f + '=read')
    except OSError as e:
        _lines = []
        _r.append(_f + '=' + type(e).__name__)
    for _line in _lines:
        _p = _line.split()
        if _p[3] == '0A':
            _ports.add(int(_p[1].rsplit(':', 1)[1], 16))
_r.append('port_seen=' + str({port} in _ports))
_token = _toks[0] if _toks else {token:?}
def _steal(opener):
    def post(body, sid=None):
        h = {{'Authorization': 'Bearer ' + _token, 'Content-Type': 'application/json',
             'Accept': 'application/json, text/event-stream'}}
        if sid:
            h['Mcp-Session-Id'] = sid
        req = urllib.request.Request('http://127.0.0.1:{port}/mcp', data=json.dumps(body).encode(), headers=h)
        with opener.open(req, timeout=10) as resp:
            return resp.headers.get('Mcp-Session-Id'), resp.read().decode()
    try:
        sid, _ = post({{'jsonrpc': '2.0', 'id': 1, 'method': 'initialize', 'params': {{
            'protocolVersion': '2025-06-18', 'capabilities': {{}},
            'clientInfo': {{'name': 'thief', 'version': '1'}}}}}})
        post({{'jsonrpc': '2.0', 'method': 'notifications/initialized'}}, sid)
        _, text = post({{'jsonrpc': '2.0', 'id': 2, 'method': 'resources/read',
                        'params': {{'uri': {uri:?}}}}}, sid)
        return 'stolen' if {A_PRIVATE:?} in text else 'other'
    except urllib.error.HTTPError as e:
        return 'HTTP' + str(e.code)
    except urllib.error.URLError as e:
        return 'URLError:' + type(e.reason).__name__
    except OSError as e:
        return type(e).__name__
_r.append('direct=' + _steal(urllib.request.build_opener(urllib.request.ProxyHandler({{}}))))
# Through the proxy the kernel is given (`--session-network proxy`), loopback not bypassed.
_proxy = os.environ.get('HTTP_PROXY')
os.environ.pop('NO_PROXY', None)
os.environ.pop('no_proxy', None)
_r.append('via_proxy=' + (_steal(urllib.request.build_opener(urllib.request.ProxyHandler({{'http': _proxy}})))
                          if _proxy else 'no-proxy'))
print('\n'.join(_r))
"#
    )
}

async fn another_tenants_notebook_is_out_of_reach(era: Era) {
    require!(TestEnv);
    // The operator's token file where the docs put it: under /etc, outside /tmp and $HOME.
    let etc = Path::new("/etc").join(format!("ipybox-test-chain-{}-{era:?}", std::process::id()));
    std::fs::create_dir_all(&etc).unwrap();
    struct Cleanup<'a>(&'a Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _cleanup = Cleanup(&etc);
    let tokens = etc.join("tokens");
    std::fs::write(&tokens, format!("# tenants\n{TOKEN_A}\n{TOKEN_B}\n")).unwrap();
    let token_file = tokens.display().to_string();
    let ws = tempfile::tempdir().unwrap();
    for confined in [true, false] {
        // Confined (the default, as root: a uid per session), two tokens need no
        // `--trust-tenants`; unconfined they are refused without it (the control says it).
        let mut flags = vec!["--token-file", token_file.as_str(), "--warm-sessions", "0"];
        if !confined {
            flags.extend(["--unconfined-sessions", "--trust-tenants"]);
        }
        let service = Service::start(ws.path(), &[], &flags);
        let alice = connect(&service.url(), Some(TOKEN_A), era).await;
        let (failed, text) = cell(&alice, &format!("print({A_PRIVATE:?})"), None).await;
        assert!(!failed, "{text}");
        let uris: Vec<String> = alice
            .service
            .list_all_resources()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.uri)
            .filter(|u| u.starts_with("ipybox://notebook/"))
            .collect();
        assert_eq!(uris.len(), 1, "{uris:?}");
        // A's own read works (the notebook is written in the background: waited for).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let read = alice
                .service
                .peer()
                .read_resource(ReadResourceRequestParams::new(uris[0].clone()))
                .await
                .unwrap();
            let holds = matches!(&read.contents[0],
                ResourceContents::TextResourceContents { text, .. } if text.contains(A_PRIVATE));
            if holds {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "A's notebook never held its output"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let bob = connect(&service.url(), Some(TOKEN_B), era).await;
        let (failed, out) = cell(
            &bob,
            &attack(&tokens, service.port, &uris[0], TOKEN_A),
            None,
        )
        .await;
        assert!(!failed, "{out}");
        let (out, _) = split_note(&out);
        let want = if confined {
            "tokens=FileNotFoundError\ntcp=read\ntcp6=read\nport_seen=False\ndirect=URLError:ConnectionRefusedError\nvia_proxy=HTTP403"
        } else {
            "tokens=read\ntcp=read\ntcp6=read\nport_seen=True\ndirect=stolen\nvia_proxy=no-proxy"
        };
        assert_eq!(out, want, "confined: {confined}\n{}", service.log());
        bob.close().await;
        alice.close().await;
    }
}
both_eras!(another_tenants_notebook_is_out_of_reach);
