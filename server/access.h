/*
 * access.h - libmicrohttpd's callbacks for every request (access.c); cls: the server's
 * gemmd_services.
 */
#ifndef GEMMD_ACCESS_H
#define GEMMD_ACCESS_H

#include <microhttpd.h>
#include <stdarg.h>

/* The access handler (MHD_AccessHandlerCallback). */
enum MHD_Result gemmd_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                             const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls);
/* MHD_OPTION_NOTIFY_COMPLETED: the request's access log line and metrics, and its end. */
void gemmd_access_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                            enum MHD_RequestTerminationCode toe);
/* MHD_OPTION_EXTERNAL_LOGGER: libmicrohttpd's own messages (client went away, TLS handshake
 * failed, ...) as ordinary log lines, ids in them cut. */
void gemmd_access_log(void *cls, const char *fmt, va_list ap);

#endif
