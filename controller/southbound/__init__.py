"""OpenFlow southbound: os-ken compatibility fixes, message building, and the os-ken app."""
