//! Host names to addresses: what to bind on, whether a configured host
//! resolves, and the IPv4 address of a network interface (`DMLC_INTERFACE`).

use std::net::{IpAddr, ToSocketAddrs};

/// Resolves a hostname (or IP literal, or `*`) to the address to bind on.
pub fn bind_ip(host: &str) -> Option<String> {
    match host {
        "*" | "0.0.0.0" => return Some("0.0.0.0".into()),
        "::" | "[::]" => return Some("::".into()),
        _ => {}
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(ip.to_string());
    }
    let addrs: Vec<_> = (host, 0).to_socket_addrs().ok()?.collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .map(|a| a.ip().to_string())
}

/// Whether `host` resolves at all (an IP literal always does).
pub fn resolves(host: &str) -> bool {
    host.parse::<IpAddr>().is_ok()
        || (host, 0)
            .to_socket_addrs()
            .map(|mut a| a.next().is_some())
            .unwrap_or(false)
}

/// An IPv4 address of a network interface (`DMLC_INTERFACE`), e.g. `lo`.
pub fn interface_ipv4(name: &str) -> Option<String> {
    let mut result = None;
    // SAFETY: getifaddrs fills a linked list we only read and then free.
    unsafe {
        let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut addrs) != 0 {
            return None;
        }
        let mut cur = addrs;
        while !cur.is_null() {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null()
                && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET
                && std::ffi::CStr::from_ptr(ifa.ifa_name).to_bytes() == name.as_bytes()
            {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                result = Some(ip.to_string());
                break;
            }
            cur = ifa.ifa_next;
        }
        libc::freeifaddrs(addrs);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution() {
        assert_eq!(bind_ip("127.0.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(bind_ip("localhost").as_deref(), Some("127.0.0.1"));
        assert!(bind_ip("no-such-host.invalid").is_none());
        assert!(!resolves("no-such-host.invalid"));
        assert_eq!(interface_ipv4("lo").as_deref(), Some("127.0.0.1"));
        assert!(interface_ipv4("no-such-if0").is_none());
    }
}
