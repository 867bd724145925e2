#!/usr/bin/env python3
"""Decode ps-lite traffic from a loopback pcap (debugging aid; needs no third-party module).

Capture (root, loopback only), e.g. while run_interop.py runs:
    timeout 120 tcpdump -i lo -U -s 0 -w /tmp/job.pcap 'tcp and host 127.0.0.1' &
    tests/interop/run_mx_only.sh ; kill %1
    tests/interop/zmtp_dump.py /tmp/job.pcap [--hex] [--vals N]

Reassembles every TCP stream, parses ZMTP 3.0 (greeting, READY with the DEALER's Identity,
frames), and prints one line per ps-lite message: sender identity -> receiver port, the decoded
PBMeta, then the data frames (keys as u64, lens as i32, vals as size and, with --vals N, the
first N float32). --hex adds the meta frame in hex. Ports are named by node id once the
scheduler's ADD_NODE table has been seen.
"""
import argparse
import struct
import sys

KEMPTY = 2147483647
ROLE = {0: "SERVER", 1: "WORKER", 2: "SCHEDULER"}
CMD = {0: "EMPTY", 1: "TERMINATE", 2: "ADD_NODE", 3: "BARRIER", 4: "ACK", 5: "HEARTBEAT"}
DTYPE = ["CHAR", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
         "FLOAT", "DOUBLE", "OTHER"]


# ---------------------------------------------------------------- pcap + TCP reassembly
def read_pcap(path):
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    if magic in (0xA1B2C3D4, 0xA1B23C4D):
        end = "<"
    elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
        end = ">"
    else:
        raise SystemExit("not a classic pcap file (use tcpdump -w, not pcapng)")
    nano = magic in (0xA1B23C4D, 0x4D3CB2A1)
    linktype = struct.unpack(end + "I", data[20:24])[0]
    off = 24
    while off + 16 <= len(data):
        ts_s, ts_f, incl, _orig = struct.unpack(end + "IIII", data[off:off + 16])
        off += 16
        pkt = data[off:off + incl]
        off += incl
        t = ts_s + ts_f / (1e9 if nano else 1e6)
        if linktype == 1:      # Ethernet (lo on Linux)
            if len(pkt) < 14:
                continue
            eth = struct.unpack("!H", pkt[12:14])[0]
            if eth != 0x0800:
                continue
            ip = pkt[14:]
        elif linktype == 113:  # Linux cooked
            ip = pkt[16:]
        elif linktype in (0, 108):  # BSD loopback
            ip = pkt[4:]
        elif linktype == 101:  # raw IP
            ip = pkt
        else:
            raise SystemExit("unsupported link type %d" % linktype)
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 15) * 4
        tot = struct.unpack("!H", ip[2:4])[0]
        src = ".".join(map(str, ip[12:16]))
        dst = ".".join(map(str, ip[16:20]))
        tcp = ip[ihl:tot]
        sport, dport, seq, _ack, offflags = struct.unpack("!HHIIH", tcp[:14])
        doff = (offflags >> 12) * 4
        flags = offflags & 0x3F
        yield t, (src, sport, dst, dport), seq, flags, tcp[doff:]


class Stream:
    def __init__(self):
        self.isn = None
        self.segs = {}   # relative seq -> (time, bytes)

    def add(self, t, seq, flags, payload):
        if flags & 0x02:  # SYN
            self.isn = (seq + 1) & 0xFFFFFFFF
            return
        if not payload:
            return
        if self.isn is None:
            self.isn = seq
        rel = (seq - self.isn) & 0xFFFFFFFF
        if rel not in self.segs or len(self.segs[rel][1]) < len(payload):
            self.segs[rel] = (t, payload)

    def chunks(self):
        """[(time, offset, bytes)] in order, overlaps trimmed."""
        out, pos = [], 0
        for rel in sorted(self.segs):
            t, p = self.segs[rel]
            if rel + len(p) <= pos:
                continue
            if rel < pos:
                p = p[pos - rel:]
                rel = pos
            if rel > pos:  # hole (capture lost data): stop here
                break
            out.append((t, rel, p))
            pos = rel + len(p)
        return out


# ---------------------------------------------------------------- protobuf
def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v = bytes(b[i:i + n])
            i += n
        elif wt == 1:
            v = b[i:i + 8]
            i += 8
        elif wt == 5:
            v = b[i:i + 4]
            i += 4
        else:
            raise ValueError("wire type %d" % wt)
        yield f, wt, v


def i32(v):
    v &= 0xFFFFFFFFFFFFFFFF
    if v >= 1 << 63:
        v -= 1 << 64
    return v


def dec_node(b):
    n = {}
    for f, _, v in fields(b):
        name = {1: "role", 2: "id", 3: "hostname", 4: "port", 5: "is_recovery", 10: "customer_id"}.get(f, "f%d" % f)
        n[name] = v.decode() if f == 3 else i32(v) if isinstance(v, int) else v
    return n


def dec_control(b):
    c = {"node": []}
    for f, _, v in fields(b):
        if f == 2:
            c["node"].append(dec_node(v))
        else:
            c[{1: "cmd", 3: "barrier_group", 4: "msg_sig"}.get(f, "f%d" % f)] = i32(v) if f != 4 else v
    return c


def dec_meta(b):
    m = {}
    for f, wt, v in fields(b):
        if f == 3:
            m["control"] = dec_control(v)
        elif f == 2:
            m["body"] = v
        elif f == 9:
            if wt == 2:
                j, lst = 0, []
                while j < len(v):
                    x, j = varint(v, j)
                    lst.append(x)
                m.setdefault("data_type", []).extend(lst)
            else:
                m.setdefault("data_type", []).append(v)
        else:
            name = {1: "head", 4: "request", 5: "push", 6: "simple_app", 7: "app_id", 8: "timestamp",
                    10: "customer_id", 11: "data_size", 12: "pull", 13: "priority"}.get(f, "f%d" % f)
            m[name] = i32(v)
    return m


def fmt_node(n):
    s = "%s" % ROLE.get(n.get("role"), n.get("role"))
    if n.get("id", KEMPTY) != KEMPTY:
        s += " id=%d" % n["id"]
    s += " %s:%s" % (n.get("hostname", "?"), n.get("port", "?"))
    if n.get("is_recovery"):
        s += " recovery"
    if "customer_id" in n:
        cid = n["customer_id"]
        s += " cust=%s" % ("kEmpty" if cid == KEMPTY else cid)
    return s


def fmt_meta(m):
    parts = []
    if "control" in m:
        c = m["control"]
        parts.append(CMD.get(c.get("cmd"), c.get("cmd")))
        if "barrier_group" in c:
            parts.append("group=%d" % c["barrier_group"])
        if "msg_sig" in c:
            parts.append("sig=%d" % c["msg_sig"])
        if c["node"]:
            parts.append("nodes=[" + "; ".join(fmt_node(n) for n in c["node"]) + "]")
    for k in ("head", "request", "push", "pull", "simple_app", "app_id", "customer_id", "timestamp",
              "priority", "data_size"):
        if k in m:
            v = m[k]
            parts.append("%s=%s" % (k, "kEmpty" if v == KEMPTY else v))
    if "body" in m:
        parts.append("body=%r" % m["body"][:60])
    if "data_type" in m:
        parts.append("types=[%s]" % ",".join(DTYPE[x] if 0 <= x < len(DTYPE) else str(x) for x in m["data_type"]))
    return " ".join(parts)


# ---------------------------------------------------------------- ZMTP
def zmtp_messages(chunks):
    """Yield ('ready', props) / ('msg', time, [frames]) from one direction of a ZMTP connection."""
    buf = bytearray()
    times = []   # (end offset, time)
    for t, off, p in chunks:
        buf += p
        times.append((off + len(p), t))

    def time_at(pos):
        for end, t in times:
            if pos < end:
                return t
        return times[-1][1] if times else 0.0

    if len(buf) < 64 or buf[0] != 0xFF or buf[9] != 0x7F:
        return
    i = 64
    frames = []
    msg_start = i
    while i < len(buf):
        if not frames:
            msg_start = i
        flags = buf[i]
        if flags & 0x02:
            if i + 9 > len(buf):
                return
            size = struct.unpack("!Q", buf[i + 1:i + 9])[0]
            i += 9
        else:
            if i + 2 > len(buf):
                return
            size = buf[i + 1]
            i += 2
        if i + size > len(buf):
            return
        body = bytes(buf[i:i + size])
        i += size
        if flags & 0x04:
            nlen = body[0]
            name = body[1:1 + nlen].decode("ascii", "replace")
            props = {}
            j = 1 + nlen
            while name == "READY" and j < len(body):
                kl = body[j]
                k = body[j + 1:j + 1 + kl].decode()
                j += 1 + kl
                vl = struct.unpack("!I", body[j:j + 4])[0]
                props[k] = body[j + 4:j + 4 + vl]
                j += 4 + vl
            yield ("cmd", name, props)
            continue
        frames.append(body)
        if not flags & 0x01:
            yield ("msg", time_at(msg_start), frames)
            frames = []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pcap")
    ap.add_argument("--hex", action="store_true", help="print each meta frame in hex")
    ap.add_argument("--vals", type=int, default=0, help="print the first N float32 of each vals frame")
    a = ap.parse_args()

    streams = {}
    for t, conn, seq, flags, payload in read_pcap(a.pcap):
        streams.setdefault(conn, Stream()).add(t, seq, flags, payload)

    # Which side of a connection listens: the one whose port appears as dport of a SYN-less first
    # packet is unknown, so use ZMTP: the DEALER (client) sends READY with Socket-Type DEALER.
    events = []
    port_name = {}
    for conn, st in streams.items():
        src, sport, dst, dport = conn
        ident = None
        stype = None
        for ev in zmtp_messages(st.chunks()):
            if ev[0] == "cmd":
                if ev[1] == "READY":
                    stype = ev[2].get("Socket-Type", b"").decode()
                    ident = ev[2].get("Identity", b"").decode("ascii", "replace")
                continue
            if stype != "DEALER":
                continue
            events.append((ev[1], ident, dport, ev[2]))
    events.sort(key=lambda e: e[0])
    if not events:
        print("no ps-lite messages found")
        return 1
    t0 = events[0][0]
    for t, ident, dport, frames in events:
        try:
            m = dec_meta(frames[0])
        except Exception as e:  # not a ps-lite meta
            print("%10.6f %s -> :%d undecodable meta (%s) %s" % (t - t0, ident or "''", dport, e, frames[0].hex()))
            continue
        c = m.get("control")
        if c and c.get("cmd") == 2:  # ADD_NODE table: name ports
            for n in c["node"]:
                if n.get("id", KEMPTY) != KEMPTY:
                    port_name[n["port"]] = "%d" % n["id"]
        to = port_name.get(dport)
        line = "%10.6f %-5s -> %-6s %s" % (t - t0, ident or "''", ("id" + to) if to else ":%d" % dport, fmt_meta(m))
        print(line)
        if a.hex:
            print("           meta %s" % frames[0].hex())
        types = m.get("data_type", [])
        for k, fr in enumerate(frames[1:]):
            ty = types[k] if k < len(types) else None
            if ty == 8 and len(fr) % 8 == 0:
                desc = "keys " + str(list(struct.unpack("<%dQ" % (len(fr) // 8), fr))[:16])
            elif ty == 3 and len(fr) % 4 == 0:
                desc = "lens " + str(list(struct.unpack("<%di" % (len(fr) // 4), fr))[:16])
            else:
                desc = "vals %d bytes" % len(fr)
                if a.vals and len(fr) >= 4:
                    n = min(a.vals, len(fr) // 4)
                    desc += " f32 " + str(list(struct.unpack("<%df" % n, fr[:4 * n])))
            print("           [%d] %s" % (k, desc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
