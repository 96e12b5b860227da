"""Real local peers for the alert channels: an HTTP server that records what the Slack and
PagerDuty notifiers post, and an SMTP server (aiosmtpd, with AUTH) that receives the email.

Nothing here mocks a channel: the providers' own clients open real sockets to these servers,
reached through Airflow Connections (``AIRFLOW_CONN_*``) that point at them.
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# Planted secrets: a test searches every log line and report for them.
SLACK_TOKEN = "T0SECRET/B0SECRET/slackWebhookSecret123"
PD_ROUTING_KEY = "pdRoutingKeySecret0123456789abcd"
SMTP_USER = "alerts-bot"
SMTP_PASSWORD = "smtpPasswordSecret!42"
SECRETS = (SLACK_TOKEN, PD_ROUTING_KEY, SMTP_PASSWORD)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_signed(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (ca.pem, also the CA bundle a client trusts) and its key."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (folder / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return str(folder / "ca.pem"), str(folder / "key.pem")


@dataclass
class Post:
    path: str
    body: dict


@dataclass
class HttpRecorder:
    """Answers POSTs like Slack (200 "ok") and PagerDuty (202 + dedup_key); records each one.

    ``fail`` maps a path prefix to the status it answers instead (e.g. {"/slack": 500}), or to
    (status, times) to recover after that many failures; status "hang" answers after ``hang_s``.
    """

    port: int = field(default_factory=free_port)
    posts: list[Post] = field(default_factory=list)
    fail: dict = field(default_factory=dict)
    tls_dir: Path | None = None  # serve HTTPS with a self-signed certificate written here (ca.pem)
    hang_s: float = 3.0
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_dir else 'http'}://127.0.0.1:{self.port}"

    @property
    def ca_bundle(self) -> str:
        return str(self.tls_dir / "ca.pem")

    def slack_posts(self) -> list[Post]:
        return [p for p in self.posts if p.path.startswith("/slack")]

    def pd_events(self) -> list[Post]:
        return [p for p in self.posts if p.path.startswith("/v2/enqueue")]

    def start(self) -> HttpRecorder:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                for prefix, rule in list(recorder.fail.items()):
                    if self.path.startswith(prefix):
                        status, times = rule if isinstance(rule, tuple) else (rule, None)
                        if times is not None:
                            recorder.fail[prefix] = (status, times - 1) if times > 1 else None
                            if recorder.fail[prefix] is None:
                                del recorder.fail[prefix]
                        if status == "hang":  # accept, read, then answer too late for the client's timeout
                            time.sleep(recorder.hang_s)
                            status = 200
                        self._answer(status, b"server error" if status != 200 else b"ok")
                        return
                body = json.loads(raw or b"{}")
                recorder.posts.append(Post(self.path, body))
                if self.path.startswith("/v2/enqueue"):
                    self._answer(202, json.dumps({"status": "success", "message": "Event processed",
                                                  "dedup_key": body.get("dedup_key", "new")}).encode())
                else:
                    self._answer(200, b"ok")

            def _answer(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if payload.startswith(b"{") else "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls_dir:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*_self_signed(self.tls_dir))
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass
class SilentPeer:
    """Accepts TCP connections and never says a word: every client waits for its own timeout."""

    port: int = field(default_factory=free_port)
    _server: socket.socket | None = None
    _held: list[socket.socket] = field(default_factory=list)

    def start(self) -> SilentPeer:
        self._server = socket.create_server(("127.0.0.1", self.port))
        server = self._server

        def accept_forever() -> None:
            while True:
                try:
                    self._held.append(server.accept()[0])  # held open, never answered
                except OSError:
                    return

        threading.Thread(target=accept_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        for conn in (*self._held, *([self._server] if self._server else [])):
            conn.close()
        self._server, self._held = None, []


@dataclass
class SmtpPeer:
    """aiosmtpd with AUTH (plain, no TLS) that keeps every message it accepts.

    ``fail_data``: the login succeeds and every message is refused with ``554`` (the server
    error of SMTP, as HTTP 500 is for the webhooks).
    """

    port: int = field(default_factory=free_port)
    messages: list[Message] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    fail_data: bool = False
    _controller: object = None

    def start(self) -> SmtpPeer:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        peer = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802
                if peer.fail_data:
                    return "554 5.3.0 Transaction failed"
                peer.messages.append(message_from_bytes(envelope.original_content or envelope.content))
                return "250 OK"

        def authenticator(server, session, envelope, mechanism, auth_data):
            ok = isinstance(auth_data, LoginPassword) and auth_data.login.decode() == SMTP_USER \
                and auth_data.password.decode() == SMTP_PASSWORD
            if ok:
                peer.logins.append(auth_data.login.decode())
            return AuthResult(success=ok)

        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, authenticator=authenticator,
                                      auth_require_tls=False, auth_required=True)
        self._controller.start()
        return self

    def stop(self) -> None:
        if self._controller:
            self._controller.stop()
            self._controller = None


def connection_env(slack: HttpRecorder, pd: HttpRecorder, smtp_port: int, slack_id="cd4ml_slack",
                   pd_id="cd4ml_pagerduty", smtp_id="cd4ml_smtp", password: str = SMTP_PASSWORD,
                   pd_trusted: bool = True, smtp_ssl: bool = False, smtp_timeout: float = 2) -> dict[str, str]:
    """AIRFLOW_CONN_* variables pointing the three channels at the local peers (PagerDuty: HTTPS only).

    ``pd_trusted=False`` leaves out the peer's CA (the system's CAs must then vouch for it);
    ``smtp_ssl`` speaks SMTP over TLS, verified against the system's CAs.
    """
    pd_extra = {"ca_bundle": pd.ca_bundle} if pd_trusted else {}
    return {
        f"AIRFLOW_CONN_{slack_id.upper()}": json.dumps(
            {"conn_type": "slackwebhook", "host": f"{slack.url}/slack/", "password": SLACK_TOKEN}),
        f"AIRFLOW_CONN_{pd_id.upper()}": json.dumps(
            {"conn_type": "pagerduty_events", "host": pd.url, "password": PD_ROUTING_KEY, "extra": pd_extra}),
        f"AIRFLOW_CONN_{smtp_id.upper()}": json.dumps(
            {"conn_type": "smtp", "host": "127.0.0.1", "port": smtp_port, "login": SMTP_USER, "password": password,
             "extra": {"disable_ssl": not smtp_ssl, "disable_tls": True, "from_email": "cd4ml@example.org",
                       "timeout": smtp_timeout, "retry_limit": 0}}),
    }


def body_text(msg: Message) -> str:
    parts = msg.walk() if msg.is_multipart() else [msg]
    return "".join(p.get_payload(decode=True).decode(errors="replace") for p in parts
                   if p.get_content_maintype() == "text")


FAILURE_KINDS = ("connection refused", "timeout", "server error", "untrusted TLS")


def failing_connections(kind: str, tls: Path, stack: ExitStack) -> dict[str, str]:
    """Every channel broken the same way; returns the AIRFLOW_CONN_* environment pointing at it.

    Refused: nothing listens. Timeout: the peer accepts and answers after the client gave up (SMTP:
    never greets). Server error: HTTP 500 (SMTP: 554 for the message). Untrusted TLS: an HTTPS or
    SMTP-over-TLS peer whose self-signed certificate the client was not given.
    """
    def started(peer):
        stack.callback(peer.stop)
        return peer.start()

    if kind == "connection refused":
        return connection_env(HttpRecorder(), HttpRecorder(tls_dir=tls / "pd"), free_port(), pd_trusted=False)
    if kind == "timeout":
        slack = started(HttpRecorder(fail={"/slack": "hang"}))
        pd = started(HttpRecorder(tls_dir=tls / "pd", fail={"/v2/enqueue": "hang"}))
        return connection_env(slack, pd, started(SilentPeer()).port, smtp_timeout=1)
    if kind == "server error":
        slack = started(HttpRecorder(fail={"/slack": 500}))
        pd = started(HttpRecorder(tls_dir=tls / "pd", fail={"/v2/enqueue": 500}))
        return connection_env(slack, pd, started(SmtpPeer(fail_data=True)).port)
    if kind == "untrusted TLS":
        slack, pd = started(HttpRecorder(tls_dir=tls / "slack")), started(HttpRecorder(tls_dir=tls / "pd"))
        smtp = started(HttpRecorder(tls_dir=tls / "smtp"))  # the handshake fails before any SMTP
        return connection_env(slack, pd, smtp.port, pd_trusted=False, smtp_ssl=True)
    raise AssertionError(kind)
