"""NIC bonds: render the netplan file, check a host before the change, verify the result."""
