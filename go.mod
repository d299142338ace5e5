module github.com/berth-dev/berth

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/godbus/dbus/v5 v5.2.4 // indirect
	github.com/landlock-lsm/go-landlock v0.11.2 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	kernel.org/pub/linux/libs/security/libcap/psx v1.2.78 // indirect
)
