"""Lean SOAP for the hot paths: the watch's polls, power-state checks, guest shutdowns.

pyVmomi builds a typed object for every element of a response; for a thousand
VMs' power states that costs about 100 ms of CPU per read (and holds the GIL
the worker threads need to issue calls). The states upsguard decides on are
scalars (enums, strings, booleans), so these reads send the same
``RetrievePropertiesEx`` pyVmomi would, over pyVmomi's own session and
kept-alive connections, and parse the answer with ElementTree: about ten times
cheaper. Calls whose answer is empty are sent the same way. A fault is still
turned into pyVmomi's exception, so ``Connection.call`` handles it as for any
other call.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from pyVmomi import SoapAdapter, vmodl

Deserializer: Any = SoapAdapter.SoapResponseDeserializer
Props = dict[str, Any]
_V = "{urn:vim25}"
_XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"
_INTS = {"int", "long", "short", "byte"}
MAX_OBJECTS = 5000  # per page, as pyVmomi's reads ask
_ENVELOPE = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    '<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    'xmlns:xsd="http://www.w3.org/2001/XMLSchema"><soapenv:Body>{}</soapenv:Body>'
    "</soapenv:Envelope>"
)


def read_objects(
    collector: Any, objects: Iterable[tuple[str, str]], paths: Mapping[str, list[str]]
) -> tuple[dict[str, Props], set[str]]:
    """Properties of the given (type, id) objects, and the ids vSphere no longer knows.

    ``paths`` maps a type name (``VirtualMachine``) to the scalar properties to
    read. An object that does not exist (deleted meanwhile) makes vSphere fail
    the whole read: it is left out and the read is made again without it.
    """
    wanted = dict((ref, kind) for kind, ref in objects)
    gone: set[str] = set()
    while wanted:
        body = "".join(
            f"<objectSet><obj type={quoteattr(kind)}>{escape(ref)}</obj><skip>false</skip>"
            "</objectSet>"
            for ref, kind in wanted.items()
        )
        try:
            return _retrieve(collector, _prop_specs(paths) + body)[0], gone
        except vmodl.fault.ManagedObjectNotFound as exc:
            missing = getattr(getattr(exc, "obj", None), "_moId", None)
            if missing not in wanted:
                raise
            del wanted[missing]
            gone.add(missing)
    return {}, gone


def read_view(
    collector: Any, view: Any, paths: Mapping[str, list[str]]
) -> tuple[dict[str, Props], dict[str, str]]:
    """Properties of every object in a ContainerView, and each one's type name."""
    objects = (
        f'<objectSet><obj type="ContainerView">{escape(view._moId)}</obj><skip>true</skip>'
        '<selectSet xsi:type="TraversalSpec"><name>view</name><type>ContainerView</type>'
        "<path>view</path><skip>false</skip></selectSet></objectSet>"
    )
    return _retrieve(collector, _prop_specs(paths) + objects)


def _prop_specs(paths: Mapping[str, list[str]]) -> str:
    return "".join(
        f"<propSet><type>{escape(kind)}</type>"
        + "".join(f"<pathSet>{escape(p)}</pathSet>" for p in props)
        + "</propSet>"
        for kind, props in paths.items()
    )


def _retrieve(collector: Any, spec: str) -> tuple[dict[str, Props], dict[str, str]]:
    this = f'<_this type="PropertyCollector">{escape(collector._moId)}</_this>'
    request = (
        f'<RetrievePropertiesEx xmlns="urn:vim25">{this}<specSet>{spec}</specSet>'
        f"<options><maxObjects>{MAX_OBJECTS}</maxObjects></options></RetrievePropertiesEx>"
    )
    found: dict[str, Props] = {}
    kinds: dict[str, str] = {}
    method = "RetrievePropertiesEx"
    while True:
        token = _parse_into(found, kinds, _post(collector, method, request))
        if token is None:
            return found, kinds
        method = "ContinueRetrievePropertiesEx"
        request = (
            f'<ContinueRetrievePropertiesEx xmlns="urn:vim25">{this}'
            f"<token>{escape(token)}</token></ContinueRetrievePropertiesEx>"
        )


def invoke(obj: Any, method: str, arguments: str = "") -> bytes:
    """Call ``method`` on a managed object with the given XML arguments; its answer, raw.

    For calls made by the thousand whose answer says nothing (``ShutdownGuest``):
    pyVmomi's serializer and deserializer cost a third of the CPU of such a call.
    """
    this = f"<_this type={quoteattr(obj._wsdlName)}>{escape(obj._moId)}</_this>"
    return _post(obj, method, f'<{method} xmlns="urn:vim25">{this}{arguments}</{method}>')


def _post(target: Any, method: str, request: str) -> bytes:
    """One SOAP call on the session's pooled connections; a fault is raised as pyVmomi's."""
    stub = target._stub
    body = _ENVELOPE.format(request).encode()
    conn = stub.GetConnection()
    try:
        status, data, keep = _exchange(stub, conn, body)
    except Exception:
        conn.close()  # the server may be sick: drop the cached connections, as pyVmomi does
        stub.DropConnections()
        raise
    if keep:
        stub.ReturnConnection(conn)
    else:
        conn.close()
    if status == 200:
        return data
    if status == 500:
        info = target._GetMethodInfo(method)
        fault = Deserializer(stub).Deserialize(io.BytesIO(data), info.result)
        if isinstance(fault, BaseException):
            raise fault
    raise ConnectionError(f"{method} answered HTTP {status}")


def _exchange(stub: Any, conn: Any, body: bytes) -> tuple[int, bytes, bool]:
    """POST ``body``; the status, the answer and whether the connection stays open.

    Straight on the connection's TLS socket: for a call with a small answer,
    http.client's header handling (the email package) costs more than all the
    rest. Through a proxy tunnel, http.client does it.
    """
    sock = conn.sock
    if sock is None or getattr(stub, "is_tunnel", False):
        return _exchange_http_client(stub, conn, body)
    host = f"[{conn.host}]" if ":" in conn.host else conn.host
    head = (
        f"POST {stub.path} HTTP/1.1\r\nHost: {host}:{conn.port}\r\n"
        f"Cookie: {stub.cookie}\r\nSOAPAction: {stub.versionId}\r\n"
        f"Content-Type: text/xml; charset=UTF-8\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode("latin-1") + body)
    received = b""
    while (end := received.find(b"\r\n\r\n")) < 0:
        received += _recv(sock)
    status_line, *lines = received[:end].decode("latin-1").split("\r\n")
    rest = received[end + 4 :]
    fields: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    if "set-cookie" in fields:
        stub.cookie = fields["set-cookie"]  # as pyVmomi does: the session may be renewed
    keep = fields.get("connection", "").lower() != "close"
    if "chunked" in fields.get("transfer-encoding", "").lower():
        data = _read_chunked(sock, rest)
    elif "content-length" in fields:
        length = int(fields["content-length"])
        while len(rest) < length:
            rest += _recv(sock)
        data = rest[:length]
    else:  # no length: the answer ends with the connection
        data, keep = rest + _read_to_end(sock), False
    return int(status_line.split(" ", 2)[1]), data, keep


def _exchange_http_client(stub: Any, conn: Any, body: bytes) -> tuple[int, bytes, bool]:
    headers = {
        "Cookie": stub.cookie,
        "SOAPAction": stub.versionId,
        "Content-Type": "text/xml; charset=UTF-8",
    }
    conn.request("POST", stub.path, body, headers)
    response = conn.getresponse()
    data: bytes = response.read()
    return response.status, data, not response.will_close


def _recv(sock: Any) -> bytes:
    data: bytes = sock.recv(65536)
    if not data:
        raise ConnectionError("the server closed the connection during an answer")
    return data


def _read_to_end(sock: Any) -> bytes:
    parts = []
    while data := sock.recv(65536):
        parts.append(data)
    return b"".join(parts)


def _read_chunked(sock: Any, received: bytes) -> bytes:
    """A chunked body (RFC 9112 7.1): size lines, chunks, a last empty chunk, trailers."""
    parts: list[bytes] = []
    while True:
        while (eol := received.find(b"\r\n")) < 0:
            received += _recv(sock)
        size = int(received[:eol].split(b";", 1)[0], 16)
        received = received[eol + 2 :]
        if size == 0:
            while not (received.startswith(b"\r\n") or b"\r\n\r\n" in received):
                received += _recv(sock)  # trailers, if any, end with an empty line
            return b"".join(parts)
        while len(received) < size + 2:
            received += _recv(sock)
        parts.append(received[:size])
        received = received[size + 2 :]


def _parse_into(found: dict[str, Props], kinds: dict[str, str], data: bytes) -> str | None:
    """Add the objects of one page to ``found``; return the token of the next page, if any."""
    root = ET.fromstring(data)  # vSphere's answer, over the verified session
    token: str | None = None
    for returnval in root.iter(f"{_V}returnval"):
        for child in returnval:
            if child.tag == f"{_V}token":
                token = child.text
            elif child.tag == f"{_V}objects":
                obj = child.find(f"{_V}obj")
                if obj is None or obj.text is None:
                    continue
                kinds[obj.text] = obj.get("type", "")
                props = found.setdefault(obj.text, {})
                for prop in child.iter(f"{_V}propSet"):
                    name = prop.findtext(f"{_V}name")
                    if name is not None:
                        props[name] = _value(prop.find(f"{_V}val"))
    return token


def _value(val: ET.Element | None) -> Any:
    """A scalar's value: booleans and integers typed, enums and strings as text."""
    if val is None:
        return None
    kind = (val.get(_XSI_TYPE) or "").rpartition(":")[2]
    text = val.text or ""
    if kind == "boolean":
        return text == "true"
    if kind in _INTS:
        return int(text)
    return text
