// Package reload owns files that hold trust or credentials and change under a
// running process (a mounted Secret that kubelet swaps, a renewed certificate):
// File keeps the last good parsed contents of one file and re-reads it when
// its identity (inode, size, modification time of the resolved path) changes;
// Roots and KeyPair are the CA bundle and certificate files built on it.
// A missing or half-written file keeps the last good contents and is logged
// once per bad state. It never keeps global state and never logs a file's
// contents.
package reload
