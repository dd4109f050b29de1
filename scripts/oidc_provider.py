#!/usr/bin/env python3
"""A local OpenID provider standing in for Microsoft Entra ID, for scripts/schemathesis.sh.

It is a real protocol peer on 127.0.0.1 (a port of its own), speaking what a gateway and a
client of Entra ID speak, for one tenant:

  GET  /{tenant}/v2.0/.well-known/openid-configuration   the discovery document
  GET  /{tenant}/discovery/v2.0/keys                     the JWKS (the key's public half)
  POST /{tenant}/oauth2/v2.0/token                       client credentials grant: a v2
                                                         access token signed RS256

The signing key is one of the committed test keys (tests/data/oidc, PKCS#1 DER), the same
keys tests/support/oidc.rs serves to the black-box tests. Only Python's standard library is
used: RS256 is RSASSA-PKCS1-v1_5 over SHA-256 (RFC 8017 section 8.2), a modular
exponentiation; so the schemathesis venv needs no crypto package, and nothing here reaches
beyond loopback. The gateway verifies what this signs with ring, so a signature this got
wrong would fail the script's first send, never pass silently.

The applications it knows and their app roles are given on the command line
(`--app CLIENT_ID=Role[,Role]`): as in Entra ID, a token's roles are what the
application was assigned, never what it asks for. No client secret is checked: the keys
sign nothing outside the tests.

Usage:
  oidc_provider.py --key tests/data/oidc/key-a.der --kid key-a --tenant TID \\
      --audience api://sendgate --app AID=Sendgate.Sender --ready-file FILE
It writes its authority (http://127.0.0.1:PORT) to FILE once it listens, and serves until
it is killed.
"""

import argparse
import base64
import hashlib
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# DER of the DigestInfo that precedes a SHA-256 digest in an EMSA-PKCS1-v1_5 encoding
# (RFC 8017 section 9.2, note 1).
SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")
TOKEN_LIFETIME_S = 3600


def der_integers(der):
    """The INTEGERs of a PKCS#1 RSAPrivateKey: SEQUENCE { version, n, e, d, p, q, ... }."""

    def read(data, at):
        tag = data[at]
        length = data[at + 1]
        at += 2
        if length & 0x80:
            count = length & 0x7F
            length = int.from_bytes(data[at:at + count], "big")
            at += count
        return tag, data[at:at + length], at + length

    tag, body, _ = read(der, 0)
    if tag != 0x30:
        raise ValueError("not a DER SEQUENCE: not a PKCS#1 RSA private key")
    values, at = [], 0
    while at < len(body):
        tag, content, at = read(body, at)
        if tag != 0x02:
            raise ValueError("a PKCS#1 RSA private key holds only INTEGERs")
        values.append(int.from_bytes(content, "big"))
    if len(values) < 4 or values[0] != 0:
        raise ValueError("not a two-prime PKCS#1 RSA private key")
    return values


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unsigned(number):
    return number.to_bytes((number.bit_length() + 7) // 8, "big")


class RsaKey:
    def __init__(self, der, kid):
        _, self.n, self.e, self.d = der_integers(der)[:4]
        self.kid = kid
        self.size = (self.n.bit_length() + 7) // 8

    def jwk(self):
        return {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self.kid,
                "n": b64url(unsigned(self.n)), "e": b64url(unsigned(self.e))}

    def sign(self, message):
        """RSASSA-PKCS1-v1_5 with SHA-256 (RS256)."""
        digest = SHA256_DIGEST_INFO + hashlib.sha256(message).digest()
        padding = b"\xff" * (self.size - len(digest) - 3)
        encoded = b"\x00\x01" + padding + b"\x00" + digest
        signature = pow(int.from_bytes(encoded, "big"), self.d, self.n)
        return signature.to_bytes(self.size, "big")

    def jwt(self, claims):
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        signing_input = ".".join(
            b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        return signing_input + "." + b64url(self.sign(signing_input.encode("ascii")))


class Provider:
    def __init__(self, key, tenant, audience, apps):
        self.key = key
        self.tenant = tenant
        self.audience = audience
        self.apps = apps
        self.authority = None

    def issuer(self):
        return f"{self.authority}/{self.tenant}/v2.0"

    def discovery(self):
        base = f"{self.authority}/{self.tenant}"
        return {
            "issuer": self.issuer(),
            "jwks_uri": f"{base}/discovery/v2.0/keys",
            "token_endpoint": f"{base}/oauth2/v2.0/token",
            "response_types_supported": ["code", "id_token", "code id_token", "token id_token"],
            "subject_types_supported": ["pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_post"],
        }

    def token(self, form):
        """A client credentials grant (RFC 6749 section 4.4): (status, body)."""
        if form.get("grant_type") != "client_credentials":
            return 400, {"error": "unsupported_grant_type"}
        client = form.get("client_id", "").lower()
        if client not in self.apps:
            return 400, {"error": "invalid_client"}
        # Entra ID's v2 scope for an application's own permissions: {resource}/.default.
        if form.get("scope") != f"{self.audience}/.default":
            return 400, {"error": "invalid_scope"}
        now = int(time.time())
        claims = {
            "aud": self.audience, "iss": self.issuer(), "tid": self.tenant, "ver": "2.0",
            "azp": client, "azpacr": "1", "idtyp": "app", "oid": client, "sub": client,
            "roles": self.apps[client], "iat": now, "nbf": now, "exp": now + TOKEN_LIFETIME_S,
        }
        return 200, {"token_type": "Bearer", "expires_in": TOKEN_LIFETIME_S,
                     "access_token": self.key.jwt(claims)}


def handler(provider):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            base = f"/{provider.tenant}"
            if self.path == f"{base}/v2.0/.well-known/openid-configuration":
                self.answer(200, provider.discovery())
            elif self.path == f"{base}/discovery/v2.0/keys":
                self.answer(200, {"keys": [provider.key.jwk()]})
            else:
                self.answer(404, {"error": "not_found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != f"/{provider.tenant}/oauth2/v2.0/token" or length > 64 * 1024:
                self.answer(404, {"error": "not_found"})
                return
            form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode("utf-8", "replace")))
            self.answer(*provider.token(form))

        def log_message(self, format, *args):
            sys.stderr.write("oidc: %s %s\n" % (self.address_string(), format % args))

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--key", required=True, help="a PKCS#1 DER RSA private key")
    parser.add_argument("--kid", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--audience", required=True)
    parser.add_argument("--app", action="append", default=[], metavar="CLIENT_ID=ROLE[,ROLE]")
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args()

    apps = {}
    for app in args.app:
        client, _, roles = app.partition("=")
        apps[client.lower()] = [r for r in roles.split(",") if r]
    with open(args.key, "rb") as f:
        key = RsaKey(f.read(), args.kid)
    provider = Provider(key, args.tenant.lower(), args.audience, apps)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(provider))
    provider.authority = "http://127.0.0.1:%d" % server.server_address[1]
    # Written whole, then renamed: the script never reads half an address.
    partial = args.ready_file + ".partial"
    with open(partial, "w") as f:
        f.write(provider.authority + "\n")
    os.replace(partial, args.ready_file)
    threading.current_thread().name = "oidc"
    server.serve_forever()


if __name__ == "__main__":
    main()
