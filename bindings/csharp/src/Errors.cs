using System;
using System.Runtime.InteropServices;
using System.Text;

namespace H2o
{
    /// <summary>h2o status codes. A newer library may return a code not named here: the
    /// exception then carries it as an unnamed Status value (see H2oException.Code).</summary>
    public enum Status
    {
        Ok = 0, InvalidArgument = 1, OutOfMemory = 2, Io = 3, ModelFormat = 4, Unsupported = 5,
        ContextFull = 6, BackendUnavailable = 7, InvalidText = 8, BufferTooSmall = 9, Tokenizer = 10,
        Internal = 11, Cancelled = 12, StateFormat = 13, BackendFailed = 14,
    }

    /// <summary>A failed h2o call: its status and the library's message.</summary>
    public class H2oException : Exception
    {
        public Status Status { get; }
        public int Code => (int)Status;

        public H2oException(Status status, string message)
            : base(StatusName(status) + ": " + message)
        {
            Status = status;
            LibraryMessage = message;
        }

        /// <summary>The message as h2o wrote it, without the status name.</summary>
        public string LibraryMessage { get; }

        /// <summary>The library's name of a status, e.g. "invalid argument".</summary>
        public static string StatusName(Status status) => Utf8.FromNative(Native.h2o_status_string((int)status));
    }

    internal static class Utf8
    {
        /// <summary>UTF-8 bytes without a terminator (text passed with its length).</summary>
        internal static byte[] Bytes(string text) => Encoding.UTF8.GetBytes(text ?? throw new ArgumentNullException());

        /// <summary>UTF-8 bytes with a NUL terminator (paths and names); a NUL inside is refused as
        /// h2o refuses a bad argument.</summary>
        internal static byte[] CString(string what, string text)
        {
            if (text == null) throw new ArgumentNullException(what);
            if (text.IndexOf('\0') >= 0) throw new H2oException(Status.InvalidArgument, what + " contains a NUL character");
            return Encoding.UTF8.GetBytes(text + "\0");
        }

        internal static string FromNative(IntPtr p, int length)
        {
            if (p == IntPtr.Zero || length == 0) return "";
            var bytes = new byte[length];
            Marshal.Copy(p, bytes, 0, length);
            return Encoding.UTF8.GetString(bytes);
        }

        internal static unsafe string FromNative(IntPtr p)
        {
            if (p == IntPtr.Zero) return "";
            int n = 0;
            while (((byte*)p)[n] != 0) n++;
            return FromNative(p, n);
        }
    }

    internal static class Check
    {
        /// <summary>Throws for a failed status, with the thread's last message.</summary>
        internal static void Status(int code)
        {
            if (code != 0) throw new H2oException((Status)code, Utf8.FromNative(Native.h2o_last_error()));
        }
    }
}
