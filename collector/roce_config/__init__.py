"""Readers of RoCE configuration: the NIC (``dcb -j``, ``ethtool -a``, sysfs), switches over
gNMI (gnmic events of OpenConfig QoS paths and SONiC CONFIG_DB tables) and Cumulus NVUE JSON, all
into :mod:`rocewatch.core.roce`."""
