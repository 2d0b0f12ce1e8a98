"""The lab's readers of Proxmox's section-config files keep a repeated key's first value, as pvegpu's do and
as pve-common's SectionConfig::parse_config does (`die "duplicate attribute\n" if defined($config->{$k})`, the
error a warning, the first value kept); `map`, an array property, keeps every line."""

from __future__ import annotations

from lab.pve.pvelib.sectionconfig import parse_mapping_cfg
from lab.pve.pvelib.storage import parse_storage_cfg
from pvegpu.facts.pci_cfg import parse_pci_cfg

MAP_A = "id=10de:2bb1,iommugroup=7,node=node,path=0000:41:00"
MAP_B = "id=10de:2bb1,iommugroup=9,node=peer,path=0000:41:00"
PCI_CFG = (
    f"gpu0\n\tdescription first\n\tmap {MAP_A}\n\tdescription second\n\tmdev 1\n\tmdev 0\n\tmap {MAP_B}\n"
)


def test_pci_cfg_repeated_keys_read_alike_by_pvegpu_and_the_lab() -> None:
    (section,) = parse_mapping_cfg(PCI_CFG)
    (mapping,) = parse_pci_cfg(PCI_CFG).mappings
    assert (section.map, section.options) == ([MAP_A, MAP_B], {"description": "first", "mdev": 1})
    assert (list(mapping.map), mapping.description, mapping.mdev) == ([MAP_A, MAP_B], "first", True)


def test_storage_cfg_repeated_key_keeps_its_first_value() -> None:
    storages = parse_storage_cfg("dir: images\n\tpath /srv/images\n\tpath /srv/other\n\tcontent iso\n")
    assert [(s.id, s.options.get("path")) for s in storages] == [
        ("local", "/var/lib/vz"),
        ("images", "/srv/images"),
    ]
