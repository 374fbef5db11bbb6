/* zt_backend.c — being written */
