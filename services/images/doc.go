// Package images is berth-imaged: the service that owns berth's container
// images. It turns an agent's image_config into a container image
// (berth-sandbox:<hash>: Debian packages and environment on a base image) and
// layers berth-agent on it — or on the default scratch+busybox agent image —
// as the isolation image a container run uses
// (berth-isolated:<version>-<hash>). Builds go through the Docker Engine API
// only; concurrent requests for one image share one build. It serves
// dev.berth.Images1 on the system bus and keeps its records in images.db.
//
// images.db (bbolt, one writer: this service):
//
//	meta/
//	  version        → uint64 big-endian schema version (boltstore)
//	images/
//	  <tag>          → JSON record: tag, kind, hash, image id, inputs,
//	                   created, size, last used, status, error, log tail
//	jobs/
//	  <id>           → JSON job: id (uint64 big-endian key), target, state,
//	                   step, total, tag, error, started, finished
//
// Schema versions (migrations in store.go, append only): 1 creates images/
// and jobs/.
package images
