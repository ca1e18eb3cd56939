/*
 * http.h - the daemon's HTTP side: libmicrohttpd with its own polling thread (epoll, a
 * thread pool), suspend/resume so that no HTTP thread ever waits on compute.
 */
#ifndef GEMMD_HTTP_H
#define GEMMD_HTTP_H

#include "config.h"
#include "engine.h"
#include "gemm_types.h"

typedef struct gemmd_server gemmd_server;

/* Starts listening on cfg->listen:cfg->port (IPv4 or IPv6 literal), or on an inherited
 * listening socket (listen_fd >= 0, already validated by the caller: a listening stream
 * socket of cfg->listen's family), which the server owns from then on, on failure too.
 * NULL with *err set when the address, the tokens file, the TLS files or the socket fail. */
gemmd_server *gemmd_http_start_fd(const gemmd_config *cfg, gemm_engine *engine, int listen_fd, gemm_err *err);
/* "http://127.0.0.1:8080" */
const char *gemmd_http_url(const gemmd_server *s);
/* The graceful stop (http.c), then s is freed; the engine is closed after it. With
 * keep_socket, the listening socket stays open (connections arriving meanwhile wait in
 * the kernel's backlog) and is returned with FD_CLOEXEC cleared, for the process that
 * replaces this one through exec; else, or when it could not be kept, -1. */
int gemmd_http_shutdown(gemmd_server *s, int keep_socket);

#endif
